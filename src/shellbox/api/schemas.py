"""Wire shapes: request bodies as pydantic models (they make the OpenAPI schema), responses
as plain dicts built from the service's records (mirroring the OpenAI objects)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from shellbox.sandbox import RuntimeInfo
from shellbox.service.models import ContainerFileRecord, ContainerRecord, FileRecord


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExpiresAfter(_Body):
    anchor: Literal["last_active_at"]
    minutes: int = Field(ge=1, le=10_080)


class DomainSecret(_Body):
    domain: str
    name: str
    value: str


class NetworkPolicy(_Body):
    type: Literal["disabled", "allowlist"]
    allowed_domains: list[str] | None = None
    domain_secrets: list[DomainSecret] | None = None


class CreateContainerBody(_Body):
    name: str = Field(max_length=256)
    expires_after: ExpiresAfter | None = None
    file_ids: list[str] | None = Field(None, max_length=100)
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None
    network_policy: NetworkPolicy | None = None
    skills: list[dict[str, Any]] | None = None


class CreateContainerFileBody(_Body):
    file_id: str


def image(info: RuntimeInfo) -> dict[str, str]:
    """Which sandbox image a container runs (an extension field: the SDK keeps extra fields).
    The id is ``<profile>-<recipe hash>``; ``shellbox image info`` lists its versions."""
    return {"id": info.image_id, "profile": info.image_profile}


# The tool-call items ``POST /v1/containers/{id}/calls`` takes, as a model emits them. The
# route reads the item itself (service.calls checks it and names the field at fault); these
# models document it.


class ShellAction(_Body):
    commands: list[str] = Field(description="run in order by bash -c in /mnt/data")
    timeout_ms: int | None = Field(None, description="per command; clamped to the maximum")
    max_output_length: int | None = Field(None, description="characters kept of each stream")


class ShellCallItem(_Body):
    type: Literal["shell_call"]
    call_id: str | None = None
    action: ShellAction


class LocalShellAction(_Body):
    type: Literal["exec"] = "exec"
    command: list[str] = Field(description="an argv")
    env: dict[str, str] | None = None
    timeout_ms: int | None = None
    user: str | None = None
    working_directory: str | None = Field(None, description="relative ones are under /mnt/data")


class LocalShellCallItem(_Body):
    type: Literal["local_shell_call"]
    call_id: str | None = None
    action: LocalShellAction


class PatchOperation(_Body):
    type: Literal["create_file", "update_file", "delete_file"]
    path: str
    diff: str | None = Field(None, description="a V4A diff (not for delete_file)")


class ApplyPatchCallItem(_Body):
    type: Literal["apply_patch_call"]
    call_id: str | None = None
    operation: PatchOperation


class CallItem(RootModel[ShellCallItem | LocalShellCallItem | ApplyPatchCallItem]):
    """One tool-call item; with ``?stream=true``, a ``shell_call`` only."""


def container(record: ContainerRecord, runtime: RuntimeInfo) -> dict[str, Any]:
    policy: dict[str, Any] = {"type": record.network_policy.get("type", "disabled")}
    if policy["type"] == "allowlist":
        policy["allowed_domains"] = list(record.network_policy.get("allowed_domains", []))
    return {
        "id": record.id,
        "object": "container",
        "name": record.name,
        "created_at": record.created_at,
        "status": record.status,
        "expires_after": {"anchor": "last_active_at", "minutes": record.expires_after_minutes},
        "last_active_at": record.last_active_at,
        "memory_limit": record.memory_limit,
        "network_policy": policy,
        "image": image(runtime),
    }


def file(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
    }


def container_file(record: ContainerFileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "container.file",
        "container_id": record.container_id,
        "path": record.container_path,
        "bytes": record.bytes,
        "created_at": record.created_at,
        "source": record.source,
    }


def page(data: Sequence[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def deleted(obj_id: str, obj: str) -> dict[str, Any]:
    return {"id": obj_id, "object": obj, "deleted": True}


# -- what the routes answer, as documented in /openapi.json ----------------------------------
# The routes build plain dicts (above); these models describe them for the OpenAPI document,
# and tests/api/test_schemathesis.py checks every answer against them. ``extra="allow"``: a
# field added later does not break a client that validates against an older document.


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorObject(_Wire):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Wire):
    """The OpenAI error envelope: every 4xx and 5xx of the OpenAI-shaped routes."""

    error: ErrorObject


class AnthropicErrorResponse(_Wire):
    """Errors of ``/v1/messages`` once it is parsing the request (Anthropic's envelope, with
    the OpenAI ``param`` and ``code`` inside)."""

    type: Literal["error"]
    error: ErrorObject


class ContainerExpiresAfter(_Wire):
    anchor: str
    minutes: int


class ContainerNetworkPolicy(_Wire):
    type: str
    allowed_domains: list[str] | None = None


class Container(_Wire):
    id: str
    object: Literal["container"]
    name: str
    created_at: int
    status: str
    expires_after: ContainerExpiresAfter
    last_active_at: int
    memory_limit: str
    network_policy: ContainerNetworkPolicy


class File(_Wire):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: str
    status_details: str | None


class ContainerFile(_Wire):
    id: str
    object: Literal["container.file"]
    container_id: str
    path: str
    bytes: int
    created_at: int
    source: str


class Skill(_Wire):
    id: str
    object: Literal["skill"]
    name: str
    description: str
    created_at: int
    default_version: str
    latest_version: str


class SkillVersion(_Wire):
    id: str
    object: Literal["skill.version"]
    skill_id: str
    version: str
    name: str
    description: str
    created_at: int


class _Page(_Wire):
    object: Literal["list"]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ContainerList(_Page):
    data: list[Container]


class FileList(_Page):
    data: list[File]


class ContainerFileList(_Page):
    data: list[ContainerFile]


class SkillList(_Page):
    data: list[Skill]


class SkillVersionList(_Page):
    data: list[SkillVersion]


class EgressEventList(_Page):
    data: list[dict[str, Any]]


class ContainerSkills(_Wire):
    object: Literal["list"]
    data: list[dict[str, Any]]
    has_more: bool


class Deleted(_Wire):
    id: str
    object: str
    deleted: bool


class CommandOutcome(_Wire):
    type: Literal["exit", "timeout"]
    exit_code: int | None = None


class CommandOutput(_Wire):
    stdout: str
    stderr: str
    outcome: CommandOutcome


class ShellCallOutput(_Wire):
    type: Literal["shell_call_output"]
    id: str
    call_id: str
    status: str
    max_output_length: int
    output: list[CommandOutput]
    files: list[dict[str, Any]]


class LocalShellCallOutput(_Wire):
    type: Literal["local_shell_call_output"]
    id: str
    call_id: str
    status: str
    output: str


class ApplyPatchCallOutput(_Wire):
    type: Literal["apply_patch_call_output"]
    id: str
    call_id: str
    status: str
    output: str


class CallOutput(RootModel[ShellCallOutput | LocalShellCallOutput | ApplyPatchCallOutput]):
    """The output item of the call, matching its ``type``."""


class WorkspaceWrite(_Wire):
    object: Literal["container.workspace.file", "container.workspace.archive"]
    path: str
    bytes: int


class WorkspacePath(_Wire):
    object: Literal["container.workspace.path"]
    path: str = Field(description="the path with its links followed, relative to /mnt/data")


class ResponseObject(_Wire):
    id: str
    object: Literal["response"]
    status: str
    output: list[dict[str, Any]]


class Message(_Wire):
    id: str
    type: Literal["message"]
    role: str
    content: list[dict[str, Any]]


class Health(_Wire):
    status: str
    version: str


# -- organization usage and costs (service/usage_report.py) ------------------------------------


class SessionsResult(_Wire):
    object: Literal["organization.usage.code_interpreter_sessions.result"]
    num_sessions: int
    project_id: str | None = None


class CostAmount(_Wire):
    value: float
    currency: str


class CostsResult(_Wire):
    object: Literal["organization.costs.result"]
    amount: CostAmount
    line_item: str | None = None
    project_id: str | None = None
    quantity: float | None = None
    quantity_unit: str | None = None
    api_key_id: str | None = None
    api_source: str | None = None


class UsageBucket(_Wire):
    object: Literal["bucket"]
    start_time: int
    end_time: int
    results: list[SessionsResult | CostsResult]


class UsagePage(_Wire):
    object: Literal["page"]
    data: list[UsageBucket]
    has_more: bool
    next_page: str | None = None
