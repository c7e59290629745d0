"""/openapi.json as the server really answers: the success body of every operation (the
models in ``schemas``), the error envelope for each error status, the multipart and raw
bodies FastAPI cannot see, and the ``Idempotency-Key`` header of the creates.

The routes return ``JSONResponse`` built from plain dicts (no response validation on the hot
path), so FastAPI alone documents ``{}`` and a 422 that never comes (validation errors are
400s here). ``OPERATIONS`` is the one table of what each operation answers;
tests/api/test_schemathesis.py checks real answers against it, and that no operation is
missing from it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from shellbox.api import schemas
from shellbox.service.idempotency import HEADER, MAX_KEY_LENGTH

JSON = "application/json"
REF = "#/components/schemas/{model}"

# What each error status means on this API (the envelope is the same for all).
ERRORS = {
    "400": "The request is invalid: `param` names the field and the message says what to change",
    "401": "No API key, or an unknown or revoked one",
    "403": "The key may not do this: an admin endpoint called with a project key",
    "404": "No such object in the caller's project, or no such route",
    "409": "A conflict: the container has expired, or the Idempotency-Key is in use or was cut off",
    "413": "The body or upload is larger than this server's limit",
    "429": "A per-project quota (containers, memory, snapshots) is used up",
    "500": "The server or the sandbox failed (logged with the request id)",
}
UPSTREAM_ERRORS = {"502": "The upstream model failed or could not be reached"}
SNAPSHOT_ERRORS = {
    "501": 'Snapshots need btrfs storage; this server has storage.backend = "none"',
}

SSE = "text/event-stream"


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {JSON: {"schema": {"$ref": REF.format(model=model.__name__)}}}


def _binary(media: str) -> dict[str, Any]:
    return {media: {"schema": {"type": "string", "format": "binary"}}}


def _sse(description: str) -> dict[str, Any]:
    """Server-sent events: the schema is that of one event (how OpenAPI 3.2's ``itemSchema``
    and schemathesis read a stream), its ``data`` a JSON object."""
    event = {
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string", "contentMediaType": JSON},
        },
    }
    return {SSE: {"schema": event}}


def _multipart(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "multipart/form-data": {
            "schema": {"type": "object", "properties": properties, "required": required}
        }
    }


_FILE = {"type": "string", "format": "binary"}
_PAGE_ERRORS = ("400", "401", "404", "413", "500")


class Operation:
    """The success answer of one operation (``ok``: media type -> schema), its request body
    when FastAPI cannot infer it, and whether it takes an Idempotency-Key."""

    def __init__(
        self,
        ok: dict[str, Any],
        *,
        body: dict[str, Any] | None = None,
        idempotent: bool = False,
        upstream: bool = False,
        snapshots: bool = False,
    ) -> None:
        self.ok = ok
        self.body = body
        self.idempotent = idempotent
        self.upstream = upstream
        self.snapshots = snapshots  # it takes or forks a snapshot: 501 without btrfs


_C = "/v1/containers"
_CF = "/v1/containers/{container_id}/files"
_W = "/v1/containers/{container_id}/workspace"
_S = "/v1/skills/{skill_id}"
_SKILL_UPLOAD = _multipart(
    {"files": {"type": "array", "items": _FILE}, "files[]": {"type": "array", "items": _FILE}},
    [],
)

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("post", _C): Operation(_json(schemas.Container), idempotent=True, snapshots=True),
    ("get", _C): Operation(_json(schemas.ContainerList)),
    ("get", _C + "/{container_id}"): Operation(_json(schemas.Container)),
    ("delete", _C + "/{container_id}"): Operation(_json(schemas.Deleted)),
    ("post", _C + "/{container_id}/calls"): Operation(
        {
            **_json(schemas.CallOutput),
            **_sse(
                "with ?stream=true: response.output_item.added, content deltas, and "
                "response.output_item.done carrying the output item"
            ),
        },
        body={JSON: {"schema": {"$ref": REF.format(model="CallItem")}}},
        idempotent=True,
    ),
    ("post", _C + "/{container_id}/pause"): Operation(_json(schemas.Container)),
    ("post", _C + "/{container_id}/resume"): Operation(_json(schemas.Container)),
    ("post", _C + "/{container_id}/snapshots"): Operation(
        _json(schemas.Snapshot), idempotent=True, snapshots=True
    ),
    ("get", "/v1/snapshots"): Operation(_json(schemas.SnapshotList)),
    ("get", "/v1/snapshots/{snapshot_id}"): Operation(_json(schemas.Snapshot)),
    ("delete", "/v1/snapshots/{snapshot_id}"): Operation(_json(schemas.Deleted)),
    ("get", _C + "/{container_id}/egress"): Operation(_json(schemas.EgressEventList)),
    ("get", _C + "/{container_id}/skills"): Operation(_json(schemas.ContainerSkills)),
    ("post", _C + "/{container_id}/ports/{port}/links"): Operation(_json(schemas.PortLink)),
    ("post", "/v1/files"): Operation(
        _json(schemas.File),
        body=_multipart(
            {
                "file": _FILE,
                "purpose": {"type": "string"},
                "expires_after[seconds]": {"type": "integer"},
            },
            ["file", "purpose"],
        ),
        idempotent=True,
    ),
    ("get", "/v1/files"): Operation(_json(schemas.FileList)),
    ("get", "/v1/files/{file_id}"): Operation(_json(schemas.File)),
    ("delete", "/v1/files/{file_id}"): Operation(_json(schemas.Deleted)),
    ("get", "/v1/files/{file_id}/content"): Operation(_binary("application/octet-stream")),
    ("post", _CF): Operation(
        _json(schemas.ContainerFile),
        body={
            **_multipart({"file": _FILE}, ["file"]),
            JSON: {
                "schema": {
                    "type": "object",
                    "properties": {"file_id": {"type": "string"}},
                    "required": ["file_id"],
                }
            },
        },
        idempotent=True,
    ),
    ("get", _CF): Operation(_json(schemas.ContainerFileList)),
    ("get", _CF + "/{file_id}"): Operation(_json(schemas.ContainerFile)),
    ("delete", _CF + "/{file_id}"): Operation(_json(schemas.Deleted)),
    ("get", _CF + "/{file_id}/content"): Operation(_binary("application/octet-stream")),
    ("get", _W + "/file"): Operation(_binary("application/octet-stream")),
    ("get", _W + "/path"): Operation(_json(schemas.WorkspacePath)),
    ("put", _W + "/file"): Operation(
        _json(schemas.WorkspaceWrite), body=_binary("application/octet-stream")
    ),
    ("get", _W + "/archive"): Operation(_binary("application/x-tar")),
    ("put", _W + "/archive"): Operation(
        _json(schemas.WorkspaceWrite), body=_binary("application/x-tar")
    ),
    ("post", "/v1/skills"): Operation(_json(schemas.Skill), body=_SKILL_UPLOAD),
    ("get", "/v1/skills"): Operation(_json(schemas.SkillList)),
    ("get", _S): Operation(_json(schemas.Skill)),
    ("post", _S): Operation(_json(schemas.Skill)),
    ("delete", _S): Operation(_json(schemas.Deleted)),
    ("get", _S + "/content"): Operation(_binary("application/zip")),
    ("post", _S + "/versions"): Operation(_json(schemas.SkillVersion), body=_SKILL_UPLOAD),
    ("get", _S + "/versions"): Operation(_json(schemas.SkillVersionList)),
    ("get", _S + "/versions/{version}"): Operation(_json(schemas.SkillVersion)),
    ("delete", _S + "/versions/{version}"): Operation(_json(schemas.Deleted)),
    ("get", _S + "/versions/{version}/content"): Operation(_binary("application/zip")),
    ("post", "/v1/responses"): Operation(
        {**_json(schemas.ResponseObject), **_sse("with stream: true, Responses API events")},
        idempotent=True,
        upstream=True,
    ),
    ("get", "/v1/responses/{response_id}"): Operation(_json(schemas.ResponseObject)),
    ("delete", "/v1/responses/{response_id}"): Operation(_json(schemas.Deleted)),
    ("post", "/v1/messages"): Operation(
        {**_json(schemas.Message), **_sse("with stream: true, Anthropic Messages events")},
        upstream=True,
    ),
    ("get", "/v1/organization/usage/code_interpreter_sessions"): Operation(
        _json(schemas.UsagePage)
    ),
    ("get", "/v1/organization/costs"): Operation(_json(schemas.UsagePage)),
    ("get", "/healthz"): Operation(_json(schemas.Health)),
}

MODELS: list[type[BaseModel]] = [
    schemas.ErrorResponse,
    schemas.AnthropicErrorResponse,
    schemas.Container,
    schemas.ContainerList,
    schemas.Snapshot,
    schemas.SnapshotList,
    schemas.Deleted,
    schemas.CallOutput,
    schemas.EgressEventList,
    schemas.ContainerSkills,
    schemas.File,
    schemas.FileList,
    schemas.ContainerFile,
    schemas.ContainerFileList,
    schemas.WorkspaceWrite,
    schemas.PortLink,
    schemas.Skill,
    schemas.SkillList,
    schemas.SkillVersion,
    schemas.SkillVersionList,
    schemas.ResponseObject,
    schemas.Message,
    schemas.Health,
    schemas.UsagePage,
]

IDEMPOTENCY_PARAM = {
    "name": HEADER,
    "in": "header",
    "required": False,
    "description": (
        "Makes the create safe to retry: a retry with the same key and the same request gets "
        "the first success back (header Idempotent-Replayed: true) and does nothing again; "
        "the same key with another request is a 400 idempotency_key_reused; while the first "
        "still runs, a 409 idempotency_key_in_use (retry); kept 24 hours."
    ),
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_LENGTH,
        "pattern": "^[!-~]+$",
    },
}


def _error_responses(path: str, op: Operation) -> dict[str, Any]:
    envelope: dict[str, Any] = {"$ref": REF.format(model="ErrorResponse")}
    if path == "/v1/messages":
        anthropic = {"$ref": REF.format(model="AnthropicErrorResponse")}
        envelope = {"anyOf": [envelope, anthropic]}
    statuses = dict(ERRORS)
    if op.upstream:
        statuses.update(UPSTREAM_ERRORS)
    if op.snapshots:
        statuses.update(SNAPSHOT_ERRORS)
    return {
        status: {"description": text, "content": {JSON: {"schema": envelope}}}
        for status, text in statuses.items()
    }


def build(app: FastAPI) -> dict[str, Any]:
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    _, defs = models_json_schema(
        [(m, "serialization") for m in MODELS] + [(schemas.CallItem, "validation")],
        ref_template=REF,
    )
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components.update(defs.get("$defs", {}))
    for path, methods in doc["paths"].items():
        for method, spec in methods.items():
            op = OPERATIONS.get((method, path))
            if op is None:
                continue  # the schemathesis test fails on an operation missing here
            responses: dict[str, Any] = {"200": {"description": "OK", "content": op.ok}}
            if path != "/healthz":
                responses.update(_error_responses(path, op))
            spec["responses"] = responses
            if op.body is not None:
                spec["requestBody"] = {"required": True, "content": op.body}
            if op.idempotent:
                spec.setdefault("parameters", []).append(IDEMPOTENCY_PARAM)
    return doc


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
