"""Fuzz every operation in /openapi.json with schemathesis and hold each answer to the
document: never a 5xx (``not_a_server_error``), only documented statuses
(``status_code_conformance``), and bodies that match their documented schema
(``response_schema_conformance``).

A bounded run: a fixed number of examples per operation (positive and negative data), first
with random ids, then with the ids of a real container, file and skill so that requests reach
the service layer. The reviewers' long run is the same with far more examples
(``SHELLBOX_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import io
import os
import zipfile
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from shellbox.api.openapi import OPERATIONS

EXAMPLES = int(os.environ.get("SHELLBOX_FUZZ_EXAMPLES", "25"))
AUTH = {"authorization": "Bearer fuzz"}
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
# The workspace archive upload is raw bytes, sent as they are.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


@pytest.fixture(scope="module")
def fuzz_server(server_factory: Any) -> Any:
    # Keyless (any bearer works) and a small container cap so fuzzed creates stay cheap.
    return server_factory(env={"SHELLBOX_LIMITS__MAX_CONTAINERS_PER_PROJECT": "6"})


SENT = [0]  # requests made, printed at the end (pytest -s)


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
        SENT[0] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=AUTH)
        except (AssertionError, BaseExceptionGroup) as exc:  # a Failure, or a FailureGroup
            failures.append(
                f"{op.method.upper()} {op.path} -> {response.status_code}: {exc}\n"
                f"{case.as_curl_command(headers=AUTH)}\n{response.text[:300]}"
            )
        assert "x-request-id" in response.headers

    try:
        check()
    except Unsatisfiable:
        # An operation with no parameters or body has no invalid form to generate.
        assert mode is GenerationMode.NEGATIVE, f"{op.method} {op.path}"
    return failures


def _skill_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fuzz/SKILL.md", "---\nname: fuzz\ndescription: a skill\n---\nbody\n")
    return buf.getvalue()


def test_every_operation_is_documented(fuzz_server: Any) -> None:
    doc = httpx.get(f"{fuzz_server.root_url}/openapi.json").json()
    ops = {(m, p) for p, methods in doc["paths"].items() for m in methods}
    assert ops == set(OPERATIONS), ops ^ set(OPERATIONS)
    for path, methods in doc["paths"].items():
        for spec in methods.values():
            assert "422" not in spec["responses"], path
            for media in spec["responses"]["200"]["content"].values():
                assert media["schema"], path  # no more {}
            if path != "/healthz":
                assert {"400", "401", "404", "413"} <= set(spec["responses"]), path


def test_json_bodies_are_documented_as_their_models(fuzz_server: Any) -> None:
    doc = httpx.get(f"{fuzz_server.root_url}/openapi.json").json()
    components = doc["components"]["schemas"]
    expected = {
        ("post", "/v1/responses"): ("ResponseRequestBody", {"model", "input", "stream"}),
        ("post", "/v1/messages"): ("MessagesRequestBody", {"model", "messages", "max_tokens"}),
        ("post", "/v1/skills/{skill_id}"): ("UpdateSkillBody", {"default_version"}),
        ("post", "/v1/containers"): ("CreateContainerBody", {"name", "network_policy"}),
        ("post", "/v1/containers/{container_id}/calls"): ("CallItem", set()),
    }
    for (method, path), (model, fields) in expected.items():
        schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert schema["schema"] == {"$ref": f"#/components/schemas/{model}"}, (path, schema)
        assert fields <= set(components[model].get("properties", {})), (model, components[model])
    assert components["ResponseRequestBody"]["required"] == ["model"]


def test_fuzzed_requests_get_documented_answers(fuzz_server: Any) -> None:
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
        skill_id = http.post(
            "/v1/skills", files={"files": ("fuzz.zip", _skill_zip(), "application/zip")}
        ).json()["id"]

    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(OPERATIONS)
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += _run(op, mode, base)
        if op.method.lower() == "delete":
            continue  # keep the real objects for the other operations
        ids = {
            name: value
            for name, value in (
                ("container_id", cid),
                ("file_id", file_id if op.path.startswith("/v1/files/") else cfile),
                ("skill_id", skill_id),
                ("version", "1"),
            )
            if "{" + name + "}" in op.path
        }
        if ids:
            failures += _run(op, GenerationMode.POSITIVE, base, path_parameters=ids)
        if op.path.endswith("/calls"):  # the streamed form too: its events have a schema
            streamed = {"path_parameters": ids, "query": {"stream": "true"}}
            failures += _run(op, GenerationMode.POSITIVE, base, **streamed)
    print(f"schemathesis: {SENT[0]} requests, {len(failures)} failures")
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:10])
