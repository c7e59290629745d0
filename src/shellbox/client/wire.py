"""What the sync and async clients share: configuration, request bodies, response parsing and
server-sent-event decoding. No I/O here, so both clients are thin shells around it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from shellbox.client.errors import InvalidResponseError, StreamError
from shellbox.client.types import (
    CallDone,
    CommandDone,
    CommandOutput,
    OutputDelta,
    Page,
    ServerEvent,
    ShellCallOutput,
    StreamEvent,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
# A server without API keys accepts any bearer token; one with keys needs a real one.
ANONYMOUS_KEY = "shellbox-anonymous"
# Commands may run for up to the server's clamp (300 s by default): reads wait longer.
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
JSON = dict[str, Any]


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    api_key: str
    timeout: httpx.Timeout

    @classmethod
    def resolve(
        cls, base_url: str | None, api_key: str | None, timeout: float | httpx.Timeout | None
    ) -> ClientConfig:
        """Explicit arguments win, then ``SHELLBOX_BASE_URL`` / ``SHELLBOX_API_KEY``."""
        url = base_url or os.environ.get("SHELLBOX_BASE_URL") or DEFAULT_BASE_URL
        key = api_key or os.environ.get("SHELLBOX_API_KEY") or ANONYMOUS_KEY
        if timeout is None:
            resolved = DEFAULT_TIMEOUT
        elif isinstance(timeout, httpx.Timeout):
            resolved = timeout
        else:
            resolved = httpx.Timeout(timeout, connect=min(timeout, 5.0))
        return cls(url.rstrip("/"), key, resolved)

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}", "user-agent": "shellbox-client"}


def container_path(container_id: str, *rest: str) -> str:
    if not container_id:
        msg = "container_id must be a non-empty string"
        raise ValueError(msg)
    return "/".join(["/containers", quote(container_id, safe=""), *rest])


def snapshot_path(snapshot_id: str) -> str:
    if not snapshot_id:
        msg = "snapshot_id must be a non-empty string"
        raise ValueError(msg)
    return "/snapshots/" + quote(snapshot_id, safe="")


def port_path(container_id: str, port: int, path: str = "/") -> str:
    """``/containers/{id}/ports/{port}/...``: ``path`` is the service's own (its query too)."""
    if not 1 <= port <= 65535:
        msg = f"port must be between 1 and 65535, not {port}"
        raise ValueError(msg)
    return container_path(container_id, "ports", str(port)) + "/" + path.lstrip("/")


def link_body(expires_in: int | None) -> dict[str, Any]:
    return {} if expires_in is None else {"expires_in": expires_in}


# -- request bodies --------------------------------------------------------------------------


def fork_body(
    snapshot_id: str,
    *,
    name: str,
    memory_limit: str | None,
    expires_after_minutes: int | None,
    network_policy: Mapping[str, Any] | None,
    skills: Sequence[Mapping[str, Any]] | None,
) -> JSON:
    """``POST /containers`` with ``snapshot_id``: a new container starting from the
    snapshot's files, with its own settings."""
    if not snapshot_id:
        msg = "snapshot_id must be a non-empty string"
        raise ValueError(msg)
    body: JSON = {"name": name, "snapshot_id": snapshot_id}
    if memory_limit is not None:
        body["memory_limit"] = memory_limit
    if expires_after_minutes is not None:
        body["expires_after"] = {"anchor": "last_active_at", "minutes": expires_after_minutes}
    if network_policy is not None:
        body["network_policy"] = dict(network_policy)
    if skills is not None:
        body["skills"] = [dict(s) for s in skills]
    return body


def snapshot_body(name: str | None) -> JSON:
    return {} if name is None else {"name": name}


def shell_call_item(
    commands: Sequence[str],
    *,
    timeout_ms: int | None,
    max_output_length: int | None,
    call_id: str | None,
) -> JSON:
    if isinstance(commands, str):
        msg = "commands must be a list of command strings, not one string"
        raise TypeError(msg)
    action: JSON = {"commands": list(commands)}
    if timeout_ms is not None:
        action["timeout_ms"] = timeout_ms
    if max_output_length is not None:
        action["max_output_length"] = max_output_length
    item: JSON = {"type": "shell_call", "action": action}
    if call_id is not None:
        item["call_id"] = call_id
    return item


def local_shell_call_item(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    working_directory: str | None,
    timeout_ms: int | None,
    user: str | None,
    call_id: str | None,
) -> JSON:
    if isinstance(command, str):
        msg = "command is an argv: a list of strings, not one string"
        raise TypeError(msg)
    action: JSON = {"type": "exec", "command": list(command), "env": dict(env or {})}
    if working_directory is not None:
        action["working_directory"] = working_directory
    if timeout_ms is not None:
        action["timeout_ms"] = timeout_ms
    if user is not None:
        action["user"] = user
    item: JSON = {"type": "local_shell_call", "action": action}
    if call_id is not None:
        item["call_id"] = call_id
    return item


def apply_patch_call_item(operation: Mapping[str, Any], *, call_id: str | None) -> JSON:
    item: JSON = {"type": "apply_patch_call", "operation": dict(operation)}
    if call_id is not None:
        item["call_id"] = call_id
    return item


def list_params(after: str | None, limit: int | None, order: str | None) -> JSON:
    params: JSON = {}
    if after is not None:
        params["after"] = after
    if limit is not None:
        params["limit"] = limit
    if order is not None:
        params["order"] = order
    return params


def workspace_params(path: str | None, exclude: Iterable[str] = ()) -> list[tuple[str, str]]:
    params = [("path", path)] if path else []
    params.extend(("exclude", e) for e in exclude)
    return params


# -- responses -------------------------------------------------------------------------------


def json_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        msg = f"the server sent a non-JSON body for {response.request.url}"
        raise InvalidResponseError(msg) from None


def page(body: Any) -> Page[Any]:
    if isinstance(body, list):  # tolerate a bare list
        return Page(data=body, has_more=False)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        msg = "the server sent a list response without a 'data' array"
        raise InvalidResponseError(msg)
    return Page(
        data=data,
        has_more=bool(body.get("has_more")),
        first_id=body.get("first_id"),
        last_id=body.get("last_id") or (data[-1].get("id") if data else None),
    )


def next_after(p: Page[Any]) -> str | None:
    """The cursor for the page after ``p``, or None when the list is done."""
    if not p.has_more or not p.data:
        return None
    last = p.data[-1]
    return last.get("id") if isinstance(last, dict) else p.last_id


# -- server-sent events ----------------------------------------------------------------------


class SSEDecoder:
    """Turns lines of a ``text/event-stream`` body into JSON payloads (one per event)."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> JSON | None:
        if line == "":
            if not self._data:
                return None
            raw, self._data = "\n".join(self._data), []
            try:
                payload = json.loads(raw)
            except ValueError:
                msg = f"the server sent an event that is not JSON: {raw[:200]!r}"
                raise InvalidResponseError(msg) from None
            return payload if isinstance(payload, dict) else {"type": "unknown", "data": payload}
        if line.startswith(":"):
            return None  # a comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


def stream_event(payload: JSON) -> StreamEvent:
    """Type one decoded event; an ``error`` event raises ``StreamError``."""
    kind = str(payload.get("type", ""))
    if kind == "error":
        raise StreamError(
            str(payload.get("message") or "the streamed call failed"),
            code=payload.get("code"),
            param=payload.get("param"),
        )
    if kind == "response.shell_call_output_content.delta":
        delta = payload.get("delta") or {}
        stream, text = next(iter(delta.items()), ("stdout", ""))
        return OutputDelta(
            int(payload.get("command_index", 0)),
            "stderr" if stream == "stderr" else "stdout",
            str(text),
        )
    if kind == "response.shell_call_output_content.done":
        outputs = payload.get("output") or [{}]
        index = int(payload.get("command_index", 0))
        return CommandDone(index, CommandOutput.from_wire(outputs[0]))
    if kind == "response.output_item.done":
        return CallDone(ShellCallOutput.from_wire(payload.get("item") or {}))
    return ServerEvent(kind, payload)
