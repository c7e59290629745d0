"""The ``Runtime`` protocol's values as JSON, and its errors, for a runtime on another machine
(``remote.py`` sends them, ``shellbox.node`` receives them) and for the driver's own copy of
a spec (``spec.json``).

An error crosses as ``{"error": {"message", "type", "param", "code", "class"}}`` (the OpenAI
envelope plus the class name) and is raised again as the same ``ShellboxError`` subclass,
found in a table of the classes ``shellbox.errors`` defines, never by a dynamic import: the
API answers a remote runtime's error with the status and envelope a local one would get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from shellbox import errors
from shellbox.errors import ErrorCode, SandboxError, ShellboxError
from shellbox.patch import PatchOperation
from shellbox.sandbox.base import (
    CommandFinished,
    CommandResult,
    CommandStarted,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    FileInfo,
    Mount,
    NetworkSpec,
    Outcome,
    OutputDelta,
    PatchResult,
    PtyRequest,
    RuntimeInfo,
    SandboxInfo,
    SecretInjection,
    SkillMount,
    SnapshotTaken,
)

# -- the spec -------------------------------------------------------------------------------


def spec_to_json(spec: ContainerSpec) -> dict[str, Any]:
    raw = dataclasses.asdict(spec)
    raw["mounts"] = [
        {"source": str(m.source), "destination": m.destination, "read_only": m.read_only}
        for m in spec.mounts
    ]
    raw["env"] = dict(spec.env)
    raw["files"] = dict(spec.files)
    raw["hosts"] = dict(spec.hosts)
    return raw


def spec_from_json(raw: Mapping[str, Any]) -> ContainerSpec:
    raw = dict(raw)
    mounts = tuple(
        Mount(Path(m["source"]), m["destination"], m.get("read_only", True))
        for m in raw.pop("mounts", [])
    )
    skills = tuple(SkillMount(s["key"], s["destination"]) for s in raw.pop("skills", []))
    net = raw.pop("network", None)
    network = None
    if net is not None:
        network = NetworkSpec(
            tuple(net.get("allowed_domains", ())),
            tuple(
                SecretInjection(s["domain"], s["placeholder"], s["value"])
                for s in net.get("secrets", ())
            ),
        )
    # A spec written before networks went by value named a namespace of the old server's
    # egress slots, which it no longer holds: the container starts with loopback only.
    raw.pop("netns_path", None)
    return ContainerSpec(**raw, mounts=mounts, skills=skills, network=network)


# -- commands -------------------------------------------------------------------------------


def request_to_json(request: ExecRequest) -> dict[str, Any]:
    raw = dataclasses.asdict(request)
    raw["env"] = dict(request.env) if request.env is not None else None
    return raw


def request_from_json(raw: Mapping[str, Any]) -> ExecRequest:
    return ExecRequest(
        commands=[str(c) for c in raw["commands"]],
        timeout_ms=int(raw["timeout_ms"]),
        max_output_length=int(raw["max_output_length"]),
        env=raw.get("env"),
        cwd=raw.get("cwd"),
        stream=bool(raw.get("stream", True)),
    )


def pty_request_to_json(request: PtyRequest) -> dict[str, Any]:
    raw = dataclasses.asdict(request)
    raw["env"] = dict(request.env) if request.env is not None else None
    return raw


def pty_request_from_json(raw: Mapping[str, Any]) -> PtyRequest:
    env = raw.get("env")
    command, cwd = raw.get("command"), raw.get("cwd")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
    ):
        msg = "request.env must be an object of strings"
        raise TypeError(msg)
    return PtyRequest(
        cols=int(raw["cols"]),
        rows=int(raw["rows"]),
        command=None if command is None else str(command),
        env=env,
        cwd=None if cwd is None else str(cwd),
    )


def result_from_json(raw: Mapping[str, Any]) -> CommandResult:
    outcome = raw["outcome"]
    return CommandResult(
        raw["stdout"], raw["stderr"], Outcome(outcome["type"], outcome.get("exit_code"))
    )


def event_to_json(event: ExecEvent) -> dict[str, Any]:
    if isinstance(event, CommandStarted):
        return {"event": "started", "command_index": event.command_index}
    if isinstance(event, CommandFinished):
        return {
            "event": "finished",
            "command_index": event.command_index,
            "result": event.result.to_wire(),
        }
    return {
        "event": "delta",
        "command_index": event.command_index,
        "stream": event.stream,
        "text": event.text,
    }


def event_from_json(raw: Mapping[str, Any]) -> ExecEvent:
    kind = raw["event"]
    index = int(raw["command_index"])
    if kind == "started":
        return CommandStarted(index)
    if kind == "finished":
        return CommandFinished(index, result_from_json(raw["result"]))
    return OutputDelta(index, raw["stream"], raw["text"])


# -- other values ---------------------------------------------------------------------------


def file_info_from_json(raw: Mapping[str, Any]) -> FileInfo:
    return FileInfo(str(raw["path"]), int(raw["size"]), int(raw["mtime_ns"]))


def sandbox_info_from_json(raw: Mapping[str, Any]) -> SandboxInfo:
    return SandboxInfo(str(raw["id"]), raw["state"])


def snapshot_from_json(raw: Mapping[str, Any]) -> SnapshotTaken:
    return SnapshotTaken(int(raw["bytes"]), float(raw["frozen_s"]))


def patch_result_from_json(raw: Mapping[str, Any]) -> PatchResult:
    return PatchResult(bool(raw["completed"]), str(raw["output"]))


def runtime_info_from_json(raw: Mapping[str, Any]) -> RuntimeInfo:
    return RuntimeInfo(
        raw["image_id"], raw["image_profile"], raw.get("cgroup"), raw.get("disk_quota")
    )


def operations_to_json(operations: Sequence[PatchOperation]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(op) for op in operations]


def operations_from_json(raw: list[Mapping[str, Any]]) -> list[PatchOperation]:
    return [PatchOperation(o["type"], o["path"], o.get("diff", ""), o.get("move_to")) for o in raw]


def value_to_json(value: object) -> Any:
    """A result for the wire: dataclasses as objects, lists and dicts as they are."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [value_to_json(v) for v in value]
    return value


# -- errors ---------------------------------------------------------------------------------


def _error_classes() -> dict[str, type[ShellboxError]]:
    found: dict[str, type[ShellboxError]] = {}
    todo: list[type[ShellboxError]] = [ShellboxError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors.__name__:
            found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


ERROR_CLASSES = _error_classes()


def error_to_json(exc: ShellboxError) -> dict[str, Any]:
    return {
        "error": {
            "message": str(exc),
            "type": exc.type,
            "param": exc.param,
            "code": str(exc.code),
            "class": type(exc).__name__,
        }
    }


def error_from_json(raw: object, status: int) -> ShellboxError:
    """The error a node answered with, as the class it raised (one of ``shellbox.errors``'s;
    anything else, a ``SandboxError`` saying what came back)."""
    body = raw.get("error") if isinstance(raw, dict) else None
    if not isinstance(body, dict):
        msg = f"the node answered {status} without an error body"
        return SandboxError(msg)
    body = cast(dict[str, Any], body)
    cls = ERROR_CLASSES.get(str(body.get("class")), SandboxError)
    code = body.get("code")
    try:
        error_code = ErrorCode(code) if isinstance(code, str) else None
    except ValueError:
        error_code = None
    param = body.get("param") if isinstance(body.get("param"), str) else None
    return cls(str(body.get("message", "")), param=param, code=error_code)
