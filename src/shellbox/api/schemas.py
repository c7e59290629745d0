"""Wire shapes: request bodies as pydantic models (they make the OpenAPI schema), responses
as plain dicts built from the service's records (mirroring the OpenAI objects)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)

from shellbox.sandbox import RuntimeInfo
from shellbox.service.models import ContainerFileRecord, ContainerRecord, FileRecord
from shellbox.store import SnapshotRecord


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
    snapshot_id: str | None = Field(
        None, max_length=64, description="start from this snapshot's files (a fork)"
    )


class CreateSnapshotBody(_Body):
    name: str | None = Field(None, max_length=256)


class CreateContainerFileBody(_Body):
    file_id: str


def _string_or_integer(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int):
        msg = "must be a version number (as a string) or 'latest'"
        raise ValueError(msg)
    return value


class UpdateSkillBody(_Body):
    # "3", 3 or "latest" (the skills service reads which version it names)
    default_version: Annotated[
        Any,
        AfterValidator(_string_or_integer),
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
    ] = Field(None, description="the version number to make the default, or 'latest'")


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = "must be a number"
        raise ValueError(msg)
    return value  # as sent: an int stays an int on its way upstream


# A JSON number, kept as it came (pydantic's float would turn 1 into 1.0).
Number = Annotated[Any, AfterValidator(_number), WithJsonSchema({"type": "number"})]


class _Open(BaseModel):
    """A body that takes fields beyond those typed here: the model APIs accept informational
    fields (``include``, ``service_tier``, ``metadata``...) and their parsers refuse the
    unsupported ones by name."""

    model_config = ConfigDict(extra="allow")


class ResponseRequestBody(_Open):
    """``POST /v1/responses``. The nested shapes (``input``, ``tools``, ``tool_choice``) are
    checked by ``responses.request``, which names the item at fault (``input[2].type``)."""

    model: StrictStr = Field(min_length=1)
    input: Any = Field(None, description="a string, or a list of input items")
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = Field(None, min_length=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    metadata: dict[str, Any] | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    max_tool_calls: StrictInt | None = Field(None, ge=1)
    parallel_tool_calls: StrictBool | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None


class MessagesRequestBody(_Open):
    """``POST /v1/messages`` (Anthropic's shape). ``messages``, ``system``, ``tools`` and
    ``tool_choice`` are checked by ``responses.messages``, which names the block at fault."""

    model: StrictStr = Field(min_length=1)
    messages: list[Any] | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    system: Any = Field(None, description="a string, or a list of text blocks")
    tools: list[Any] | None = None
    tool_choice: Any = None
    stream: StrictBool | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    stop_sequences: list[StrictStr] | None = None


def image(info: RuntimeInfo) -> dict[str, str]:
    """Which sandbox image a container runs (an extension field: the SDK keeps extra fields).
    The id is ``<profile>-<recipe hash>``; ``shellbox image info`` lists its versions."""
    return {"id": info.image_id, "profile": info.image_profile}


# The tool-call items ``POST /v1/containers/{id}/calls`` takes, as a model emits them. The
# route reads the body itself (json_body.py: one copy of a large body) and checks it against
# the model its ``type`` names (``CALL_ITEMS``); the limits (how many commands, the clamps)
# and the item types a feature adds are the calls service's, which checks every item it runs.


class ShellAction(_Body):
    commands: list[StrictStr] = Field(description="run in order by bash -c in /mnt/data")
    timeout_ms: StrictInt | None = Field(None, description="per command; clamped to the maximum")
    max_output_length: StrictInt | None = Field(None, description="characters kept of each stream")


class ShellCallItem(_Body):
    type: Literal["shell_call"]
    call_id: str | None = None
    action: ShellAction


class LocalShellAction(_Body):
    type: Literal["exec"] = "exec"
    command: list[StrictStr] = Field(description="an argv")
    env: dict[str, StrictStr] | None = None
    timeout_ms: StrictInt | None = None
    user: StrictStr | StrictInt | None = Field(None, description="user, sandbox or 1000")
    working_directory: str | None = Field(None, description="relative ones are under /mnt/data")


class LocalShellCallItem(_Body):
    type: Literal["local_shell_call"]
    call_id: str | None = None
    action: LocalShellAction


class PatchOperation(_Body):
    type: Literal["create_file", "update_file", "delete_file"]
    path: StrictStr
    diff: StrictStr | None = Field(None, description="a V4A diff (not for delete_file)")
    move_to: StrictStr | None = Field(None, description="update_file only: the new path")


class ApplyPatchCallItem(_Body):
    """One of ``operation``, ``operations`` (the Agents SDK's plural form) or ``patch`` (a
    whole ``*** Begin Patch`` envelope)."""

    type: Literal["apply_patch_call"]
    call_id: str | None = None
    operation: PatchOperation | None = None
    operations: list[PatchOperation] | None = None
    patch: StrictStr | None = None


class CallItem(RootModel[ShellCallItem | LocalShellCallItem | ApplyPatchCallItem]):
    """One tool-call item; with ``?stream=true``, a ``shell_call`` only."""


CALL_ITEMS: dict[str, type[_Body]] = {
    "shell_call": ShellCallItem,
    "local_shell_call": LocalShellCallItem,
    "apply_patch_call": ApplyPatchCallItem,
}


def field_path(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """The field of ``model`` an error at ``loc`` is in: ``("action", "commands", 0)`` is
    ``action.commands`` (the list), ``("action", "env", "A")`` is ``action.env`` (the map)."""
    parts: list[str] = []
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            break
        parts.append(part)
        annotation = current.model_fields[part].annotation
        current = next(
            (
                a
                for a in (annotation, *get_args(annotation))
                if get_origin(a) is None and isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
    return ".".join(parts) or "body"


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


def snapshot(record: SnapshotRecord, expires_at: int) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "container.snapshot",
        "container_id": record.container_id,
        "name": record.name,
        "created_at": record.created_at,
        "last_used_at": record.last_used_at,
        "expires_at": expires_at,
        "bytes": record.bytes,
        "status": record.status,
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


class Snapshot(_Wire):
    """A container's saved writable state (``/mnt/data``, ``/home/user``, the rootfs layer)."""

    id: str
    object: Literal["container.snapshot"]
    container_id: str
    name: str | None
    created_at: int
    last_used_at: int  # when it was taken or last forked
    expires_at: int  # last_used_at + lifecycle.snapshot_expires_after_days
    bytes: int  # what the container's disk held when the snapshot was taken
    status: str


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


class SnapshotList(_Page):
    data: list[Snapshot]


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


class PortLink(_Wire):
    object: Literal["container.port_link"]
    container_id: str
    port: int
    url: str = Field(description="opens the service without a key until expires_at")
    expires_at: int = Field(description="Unix seconds")


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
