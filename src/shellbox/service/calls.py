"""Running one tool-call item in a container and building the matching output item.

``shell_call`` -> ``shell_call_output`` (with the ``files`` the call created or changed),
``local_shell_call`` -> ``local_shell_call_output`` (the text OpenAI's reference loop makes).
``apply_patch_call`` is handled by ``service.patching`` when it is registered.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, cast

from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.sandbox import CommandFinished, CommandResult, ExecEvent, OutputDelta
from shellbox.sandbox.base import ExecRequest
from shellbox.sandbox.datapath import DATA_MOUNT
from shellbox.service.containers import ContainerService
from shellbox.service.files import FileService
from shellbox.service.models import ContainerFileRecord, Principal
from shellbox.service.shell import ShellLimits, int_or_null, shell_call_output_item

MAX_CITED_FILES = 10
SANDBOX_USERS = ("user", "1000", "sandbox")

ItemHandler = Callable[[Principal, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def citation(cid: str, f: ContainerFileRecord) -> dict[str, Any]:
    return {
        "type": "container_file_citation",
        "container_id": cid,
        "file_id": f.id,
        "filename": f.path.rsplit("/", 1)[-1],
        "start_index": 0,
        "end_index": 0,
    }


def _require(item: dict[str, Any], key: str, kind: type | tuple[type, ...], param: str) -> Any:
    value = item.get(key)
    if not isinstance(value, kind):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        msg = f"{param} is required and must be {expected}"
        raise InvalidRequest(msg, param=param)
    return value


class CallService:
    def __init__(
        self, containers: ContainerService, files: FileService, limits: ShellLimits
    ) -> None:
        self.containers = containers
        self.files = files
        self.limits = limits
        # Extra item types (apply_patch_call) register here: type -> handler.
        self.handlers: dict[str, ItemHandler] = {}

    # -- parsing ----------------------------------------------------------------------------

    def shell_request(self, item: dict[str, Any]) -> ExecRequest:
        action = _require(item, "action", dict, "action")
        commands = action.get("commands")
        timeout = int_or_null(action.get("timeout_ms"), param="action.timeout_ms")
        max_len = int_or_null(action.get("max_output_length"), param="action.max_output_length")
        return self.limits.exec_request(commands, timeout, max_len)

    @staticmethod
    def call_id(item: dict[str, Any]) -> str:
        for key in ("call_id", "id"):
            value = item.get(key)
            if value is not None and not isinstance(value, str):
                msg = f"{key} must be a string (or left out)"
                raise InvalidRequest(msg, param=key)
        return item.get("call_id") or item.get("id") or new_id("call_")

    # -- shell_call -------------------------------------------------------------------------

    async def shell_call(
        self, principal: Principal, cid: str, item: dict[str, Any]
    ) -> dict[str, Any]:
        """Run a ``shell_call`` and return its output item. Not built on the streamed form:
        without deltas the agent sends each command's result once, and nothing is made per
        chunk of output."""
        request = self.shell_request(item)
        call_id = self.call_id(item)
        async with self.containers.activity(principal, cid):
            mark = self.files.change_mark(cid)
            results = await self.containers.runtime.run(cid, request)
            cited = await self.files.changed_since(cid, mark)
        out = shell_call_output_item(call_id, results, request.max_output_length)
        out["files"] = [citation(cid, f) for f in cited[:MAX_CITED_FILES]]
        return out

    async def shell_call_events(
        self, principal: Principal, cid: str, item: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The streamed form: SSE-ready events, the last one carrying the whole output item."""
        request = self.shell_request(item)
        call_id = self.call_id(item)
        item_id = new_id("sho_")
        seq = 0

        def event(kind: str, **fields: Any) -> dict[str, Any]:
            nonlocal seq
            seq += 1
            return {"type": kind, "sequence_number": seq, **fields}

        results: list[CommandResult] = []
        async with self.containers.activity(principal, cid):
            mark = self.files.change_mark(cid)
            yield event(
                "response.output_item.added",
                output_index=0,
                item={
                    "type": "shell_call_output",
                    "id": item_id,
                    "call_id": call_id,
                    "status": "in_progress",
                    "output": [],
                    "max_output_length": request.max_output_length,
                },
            )
            # Closed with this stream (the client left), so the command is killed now.
            exec_events = self.containers.runtime.exec(cid, request)
            stream = cast(AsyncGenerator[ExecEvent, None], exec_events)
            async with aclosing(stream) as events:
                async for ev in events:
                    if isinstance(ev, OutputDelta):
                        yield event(
                            "response.shell_call_output_content.delta",
                            output_index=0,
                            item_id=item_id,
                            command_index=ev.command_index,
                            delta={ev.stream: ev.text},
                        )
                    elif isinstance(ev, CommandFinished):
                        results.append(ev.result)
                        yield event(
                            "response.shell_call_output_content.done",
                            output_index=0,
                            item_id=item_id,
                            command_index=ev.command_index,
                            output=[ev.result.to_wire()],
                        )
            cited = await self.files.changed_since(cid, mark)
        out = shell_call_output_item(call_id, results, request.max_output_length, item_id=item_id)
        out["files"] = [citation(cid, f) for f in cited[:MAX_CITED_FILES]]
        yield event("response.output_item.done", output_index=0, item=out)

    # -- local_shell_call -------------------------------------------------------------------

    async def local_shell_call(
        self, principal: Principal, cid: str, item: dict[str, Any]
    ) -> dict[str, Any]:
        action = _require(item, "action", dict, "action")
        call_id = self.call_id(item)
        argv = action.get("command")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            msg = "action.command must be a list of strings (an argv)"
            raise InvalidRequest(msg, param="action.command")
        env = action.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            msg = "action.env must be an object of string values"
            raise InvalidRequest(msg, param="action.env")
        for name in env:
            if not name or "=" in name:
                msg = f"action.env names a variable {name!r}; a name is non-empty and has no '='"
                raise InvalidRequest(msg, param=f"action.env.{name}")
        timeout = int_or_null(action.get("timeout_ms"), param="action.timeout_ms")
        user = action.get("user")
        workdir = action.get("working_directory")
        if workdir is not None and not isinstance(workdir, str):
            msg = "action.working_directory must be a string"
            raise InvalidRequest(msg, param="action.working_directory")
        if user and str(user) not in SANDBOX_USERS:
            text = f"Unsupported execution user: {user}.\n"
        elif not argv:
            text = "Command is empty.\n"
        else:
            command = shlex.join(argv)
            if workdir:
                # The agent falls back to / when it cannot enter the directory; ``cd`` first
                # makes a missing directory an error in the output instead, as a local shell's
                # would be. Relative directories are relative to /mnt/data, like commands.
                workdir = posixpath.join(DATA_MOUNT, workdir)
                command = f"cd -- {shlex.quote(workdir)} || exit 1\n{command}"
            request = self.limits.exec_request(
                [command],
                timeout,
                None,
                param="action.command",
                env=env,
                cwd=workdir,
            )
            async with self.containers.activity(principal, cid):
                [result] = await self.containers.runtime.run(cid, request)
                await self.files.sync(cid)
            text = result.stdout + result.stderr
            if result.outcome.type == "timeout":
                text += "Command timed out.\n"
            elif result.outcome.exit_code:
                text += f"Command failed with exit code {result.outcome.exit_code}.\n"
        return {
            "type": "local_shell_call_output",
            "id": call_id,
            "call_id": call_id,
            "status": "completed",
            "output": text,
        }

    # -- dispatch ---------------------------------------------------------------------------

    async def call(self, principal: Principal, cid: str, item: dict[str, Any]) -> dict[str, Any]:
        self.call_id(item)  # checked here for every type, before anything runs
        kind = item.get("type")
        if kind == "shell_call":
            return await self.shell_call(principal, cid, item)
        if kind == "local_shell_call":
            return await self.local_shell_call(principal, cid, item)
        handler = self.handlers.get(str(kind))
        if handler is not None:
            return await handler(principal, cid, item)
        supported = ", ".join(["shell_call", "local_shell_call", *self.handlers])
        msg = f"unsupported item type {kind!r}; this endpoint takes one of: {supported}"
        raise InvalidRequest(msg, param="type")
