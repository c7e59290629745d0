"""network_policy at the API: validation and operator-bound 400s through the openai SDK,
and the ``--egress-allow`` bound on a server of its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from egress_helpers import (
    SNI_PROBE,
    EgressServer,
    Upstream,
    cleanup,
    create,
    run,
    start_server,
    wait_for,
)

from shellbox.settings import load_settings


def allowlist(domains: Any, secrets: Any = None) -> dict[str, Any]:
    policy: dict[str, Any] = {"type": "allowlist", "allowed_domains": domains}
    if secrets is not None:
        policy["domain_secrets"] = secrets
    return policy


@pytest.mark.parametrize(
    ("policy", "param", "words"),
    [
        (allowlist([]), "network_policy.allowed_domains", "1 to 50 entries"),
        (allowlist([f"h{i}.io" for i in range(51)]), "network_policy.allowed_domains", "got 51"),
        ({"type": "allowlist"}, "network_policy.allowed_domains", "is required"),
        (allowlist(["pypi.org", "https://x.io"]), "network_policy.allowed_domains[1]", "scheme"),
        (allowlist(["x.io/simple"]), "network_policy.allowed_domains[0]", "without a path"),
        (allowlist(["x.io:8443"]), "network_policy.allowed_domains[0]", "without a port"),
        (allowlist(["192.168.1.1"]), "network_policy.allowed_domains[0]", "not an IP"),
        (allowlist(["PyPI.org"]), "network_policy.allowed_domains[0]", "lowercase"),
        (
            allowlist(["a.io"], [{"domain": "b.io", "name": "T", "value": "v"}]),
            "network_policy.domain_secrets[0].domain",
            "'b.io' is not allowed by allowed_domains",
        ),
        (
            allowlist(["a.io"], [{"domain": "a.io", "name": "9T", "value": "v"}]),
            "network_policy.domain_secrets[0].name",
            "environment variable name",
        ),
        (
            allowlist(["a.io"], [{"domain": "a.io", "name": "T"}]),
            "network_policy.domain_secrets[0].value",
            "Field required",
        ),
    ],
)
def test_invalid_policies_are_400s_naming_the_entry(
    egress: EgressServer, policy: dict[str, Any], param: str, words: str
) -> None:
    client = egress.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.containers.create(name="bad", network_policy=policy)
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == param, body
    assert words in body["message"], body


def test_secret_values_never_appear_in_error_messages(egress: EgressServer) -> None:
    client = egress.client()
    value = "top-secret-\nvalue"
    with pytest.raises(openai.BadRequestError) as err:
        client.containers.create(
            name="bad",
            network_policy=allowlist(["a.io"], [{"domain": "a.io", "name": "T", "value": value}]),
        )
    assert "top-secret" not in str(err.value.body)


@pytest.fixture(scope="module")
def bounded(server_factory: Callable[..., Any], upstream: Upstream) -> Any:
    """A server with an operator bound, which also decrypts only what carries secrets."""
    es = start_server(
        server_factory,
        [
            "--egress-allow", "*.example.test,pypi.org",
            "--egress-allow", "files.pythonhosted.org",
            "--egress-upstream-ca", str(upstream.ca),
            "--egress-hosts-file", str(upstream.hosts_file),
        ],
        env={"SHELLBOX_EGRESS__INTERCEPT": "secrets"},
    )  # fmt: skip
    yield es
    cleanup(es)


def test_operator_bound(bounded: EgressServer) -> None:
    client = bounded.client()
    for domains, bad in (
        (["pypi.org", "evil.example.com"], "evil.example.com"),
        (["*"], "*"),
        (["*.test"], "*.test"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.containers.create(name="bound", network_policy=allowlist(domains))
        body = err.value.body
        assert isinstance(body, dict)
        assert f"'{bad}' is outside this server's egress allowlist" in body["message"], body
        assert "*.example.test, pypi.org, files.pythonhosted.org" in body["message"]
    with bounded.http as http:
        cid = create(http, allowlist(["api.example.test", "files.pythonhosted.org"]))
        [r] = run(
            http, cid, "curl -sS -m 20 -o /dev/null -w '%{http_code}' https://api.example.test/"
        )
        http.delete(f"/v1/containers/{cid}")
    assert r["stdout"] == "200", r


def test_intercept_secrets_tunnels_the_other_hosts(
    bounded: EgressServer, upstream: Upstream
) -> None:
    policy = allowlist(
        ["api.example.test", "other.example.test"],
        [{"domain": "api.example.test", "name": "TOKEN", "value": "tunnel-s3cret"}],
    )
    curl = 'curl -sS -m 20 -H "Authorization: Bearer $TOKEN"'
    upstream.clear()
    with bounded.http as http:
        cid = create(http, policy)
        api, other, refused, fronted = run(
            http,
            cid,
            f"{curl} https://api.example.test/echo?m=api",
            f"{curl} https://other.example.test/echo?m=other",
            f"{curl} https://blocked.example.test/echo",
            # a tunnel would carry this SNI to the upstream: it is intercepted and refused
            f"API_KEY=x python3 -c '{SNI_PROBE}' other.example.test blocked.example.test",
        )

        # The proxy writes its audit rows on its own pace: wait for the four requests'.
        def events_of() -> list[dict[str, Any]]:
            params = {"order": "asc"}
            data: list[dict[str, Any]] = http.get(
                f"/v1/containers/{cid}/egress", params=params
            ).json()["data"]
            return data

        wait_for(lambda: len(events_of()) >= 4)
        events = events_of()
        http.delete(f"/v1/containers/{cid}")
    seen = {s["path"]: s["headers"]["authorization"] for s in upstream.seen()}
    assert seen["/echo?m=api"] == "Bearer tunnel-s3cret"  # decrypted: the secret goes in
    assert seen["/echo?m=other"].startswith("Bearer shellbox-secret-")  # tunnelled as sent
    assert "tunnel-s3cret" not in api["stdout"] + other["stdout"]
    assert "CONNECT tunnel failed, response 403" in refused["stderr"]
    assert fronted["stdout"].strip() == "HTTP/1.1 421 Misdirected Request", fronted
    assert "blocked.example.test" not in upstream.handshakes()
    summary = [(e["method"], e["host"], e["path"], e["decision"]) for e in events]
    assert summary == [
        ("GET", "api.example.test", "/echo", "allowed"),
        ("CONNECT", "other.example.test", "", "allowed"),
        ("CONNECT", "blocked.example.test", "", "refused"),
        ("GET", "other.example.test", "/echo", "refused"),
    ], summary
    assert "tunnelled" in events[1]["reason"]


def test_bound_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "shellbox.toml"
    config.write_text('[egress]\nallow = ["*.corp.example"]\nhosts_file = "/etc/hosts"\n')
    settings = load_settings(config, state_dir=tmp_path)
    assert settings.egress.allow == ["*.corp.example"]
    assert settings.egress.hosts_file == Path("/etc/hosts")
