"""A response echoes its request's tools, but never a domain_secrets value."""

from __future__ import annotations

import json

from shellbox.responses.request import REDACTED, parse_response_request


def test_domain_secret_values_are_not_echoed() -> None:
    tools = [
        {
            "type": "shell",
            "environment": {
                "type": "container_auto",
                "network_policy": {
                    "type": "allowlist",
                    "allowed_domains": ["api.example.com"],
                    "domain_secrets": [
                        {"domain": "api.example.com", "name": "TOKEN", "value": "s3cr3t-value"}
                    ],
                },
            },
        },
        {"type": "apply_patch"},
    ]
    body = {"model": "m", "input": "hi", "tools": tools}
    request, _ = parse_response_request(body)
    echoed = json.dumps(request.echo)
    assert "s3cr3t-value" not in echoed
    secret = request.echo["tools"][0]["environment"]["network_policy"]["domain_secrets"][0]
    assert secret == {"domain": "api.example.com", "name": "TOKEN", "value": REDACTED}
    assert request.echo["tools"][1] == {"type": "apply_patch"}
    # The container itself is still created with the real value.
    assert "s3cr3t-value" in repr(request.tools)
