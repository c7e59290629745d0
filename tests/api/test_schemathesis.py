"""Fuzz every operation in /openapi.json with schemathesis: whatever arrives, no 5xx.

A bounded number of examples per operation (positive and negative data), first with random
ids, then with the ids of a real container and file so that requests reach the service layer.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

EXAMPLES = 20
AUTH = {"authorization": "Bearer fuzz"}


@pytest.fixture(scope="module")
def fuzz_server(server_factory: Any) -> Any:
    # Keyless (any bearer works) and a small container cap so fuzzed creates stay cheap.
    return server_factory(env={"SHELLBOX_LIMITS__MAX_CONTAINERS_PER_PROJECT": "6"})


def _run(op: Any, mode: GenerationMode, base_url: str, **fixed: Any) -> list[str]:
    failures: list[str] = []

    @given(case=op.as_strategy(generation_mode=mode, **fixed))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: Any) -> None:
        response = case.call(base_url=base_url, headers=AUTH, timeout=30)
        if response.status_code >= 500:
            failures.append(
                f"{op.method.upper()} {op.path} -> {response.status_code}: "
                f"{case.as_curl_command(headers=AUTH)}\n{response.text[:300]}"
            )
        assert "x-request-id" in response.headers

    try:
        check()
    except Unsatisfiable:
        # An operation with no parameters or body has no invalid form to generate.
        assert mode is GenerationMode.NEGATIVE, f"{op.method} {op.path}"
    return failures


def test_no_server_errors(fuzz_server: Any) -> None:
    base = fuzz_server.root_url
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    with httpx.Client(base_url=base, headers=AUTH, timeout=60) as http:
        cid = http.post("/v1/containers", json={"name": "fuzz-target"}).json()["id"]
        http.post(
            f"/v1/containers/{cid}/calls",
            json={"type": "shell_call", "call_id": "c", "action": {"commands": ["echo x > a.txt"]}},
        )
        cfile = http.get(f"/v1/containers/{cid}/files").json()["data"][0]["id"]
        file_id = http.post(
            "/v1/files", files={"file": ("f.txt", b"f")}, data={"purpose": "user_data"}
        ).json()["id"]

    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    for op in operations:
        if op.path.startswith("/v1/responses") or op.path.startswith("/v1/messages"):
            continue  # model endpoints: fuzzing them would call an upstream model
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += _run(op, mode, base)
        if op.method.lower() == "delete":
            continue  # keep the real objects for the other operations
        ids = {
            name: value
            for name, value in (("container_id", cid), ("file_id", cfile))
            if "{" + name + "}" in op.path
        }
        if op.path.startswith("/v1/files/"):
            ids = {"file_id": file_id}
        if ids:
            failures += _run(op, GenerationMode.POSITIVE, base, path_parameters=ids)
    assert not failures, "\n\n".join(failures[:10])
