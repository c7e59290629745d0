"""The tool loop: ask the model, run the calls it makes in the sandbox, feed the outputs back,
and again, until it answers without calls, hands calls to the client, or reaches a cap.

A ``Run`` yields Responses API events as it goes (the streamed form); the non-streamed form
reads the same events and keeps the last one, so both produce the same response. Streamed,
each model turn is streamed from the upstream too: the model's text is shown as it writes it
(``LiveMessage``), and the turn's items are then finished or shown in the turn's order, as
they would be unstreamed. Calls still run only once the turn is whole. Shell calls
go through ``CallService.shell_call_events``, the path of a direct call, so limits, tenancy
and file indexing are the same as for ``POST /v1/containers/{id}/calls``.

Caps, per response: model turns (``max_iterations``; past it the response is ``incomplete``
with reason ``max_tool_iterations``), sandbox seconds (``max_sandbox_time``; a command's
timeout is also clamped to what is left) and characters of tool output fed back
(``max_tool_output``), plus the request's own ``max_tool_calls`` (calls past it are not run
and the model is asked to answer without tools).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

from shellbox.errors import FileNotFound, InvalidRequest, ShellboxError, UpstreamError
from shellbox.ids import new_id
from shellbox.responses import openrouter
from shellbox.responses.events import Emitter, Event, LiveMessage, item_events
from shellbox.responses.items import CALL_TYPES
from shellbox.responses.tools import AUTO, NONE, ToolChoice, ToolSet
from shellbox.responses.upstream import (
    ItemDone,
    Live,
    TextDelta,
    Turn,
    TurnPart,
    TurnRequest,
    UpstreamClient,
    UpstreamFailedMidRun,
    UpstreamTarget,
    Usage,
)
from shellbox.service.calls import CallService
from shellbox.service.files import FileService
from shellbox.service.metering import SandboxClock
from shellbox.service.models import ContainerRecord, Principal

log = logging.getLogger("shellbox.responses")

MAX_ANNOTATIONS = 20
FORWARDED = ("type", "sequence_number", "output_index")

# What of a turn was shown before it ended, in output order: live messages, and whole items.
Shown = LiveMessage | dict[str, Any]


@dataclass(frozen=True)
class Caps:
    max_iterations: int
    max_sandbox_ns: int
    max_output_chars: int


@dataclass
class LoopRequest:
    """One request to the loop, whichever API it came through."""

    model: str
    input_items: list[dict[str, Any]]
    instructions: str | None = None
    tools: ToolSet = field(default_factory=ToolSet)
    tool_choice: ToolChoice = AUTO
    previous_response_id: str | None = None
    store: bool = True
    max_tool_calls: int | None = None
    params: dict[str, Any] = field(default_factory=dict)  # sampling, by Responses API names
    echo: dict[str, Any] = field(default_factory=dict)  # fields shown back on the response


def error_output(call: dict[str, Any], message: str) -> dict[str, Any]:
    """The output item that answers a call which did not run, worded for the model."""
    kind, call_id = call["type"], call["call_id"]
    if kind == "shell_call":
        entry = {"stdout": "", "stderr": message, "outcome": {"type": "exit", "exit_code": 1}}
        return {
            "type": "shell_call_output",
            "id": new_id("sho_"),
            "call_id": call_id,
            "status": "incomplete",
            "max_output_length": None,
            "output": [entry],
        }
    if kind == "apply_patch_call":
        return {
            "type": "apply_patch_call_output",
            "id": new_id("apo_"),
            "call_id": call_id,
            "status": "failed",
            "output": message,
        }
    if kind == "local_shell_call":
        return {
            "type": "local_shell_call_output",
            "id": new_id("lso_"),
            "call_id": call_id,
            "status": "incomplete",
            "output": message,
        }
    return {
        "type": "function_call_output",
        "id": new_id("fco_"),
        "call_id": call_id,
        "status": "completed",
        "output": message,
    }


class Run:
    def __init__(
        self,
        *,
        response_id: str,
        principal: Principal,
        request: LoopRequest,
        history: list[dict[str, Any]],
        instructions: str | None,
        container: ContainerRecord | None,
        target: UpstreamTarget,
        upstream: UpstreamClient,
        calls: CallService,
        files: FileService,
        caps: Caps,
        on_finish: Callable[[Run], None] | None = None,
        on_call: Callable[[str, float, dict[str, Any]], None] | None = None,
    ) -> None:
        self.id = response_id
        self.principal = principal
        self.request = request
        self.history = history
        self.instructions = instructions
        self.container = container
        self.target = target
        self.upstream = upstream
        self.calls = calls
        self.files = files
        self.caps = caps
        self.on_finish = on_finish
        self.on_call = on_call  # (item type, seconds, output item) of each call that ran
        self.clock = SandboxClock()  # sandbox time, as metered: from the first command on
        self.created_at = int(time.time())
        self.completed_at: int | None = None
        self.status = "in_progress"
        self.incomplete_reason: str | None = None
        self.error: dict[str, Any] | None = None
        self.output: list[dict[str, Any]] = []
        self.usage = Usage()
        self.call_ids = {i["call_id"] for i in history if "call_id" in i}
        self.citations: dict[str, dict[str, Any]] = {}  # file_id -> citation, newest last
        self.hosted_calls = 0
        self.output_chars = 0
        self.sandbox_ns = 0  # whole hosted calls: what max_sandbox_s counts
        self.exec_ns = 0  # commands only (first command start to last command end)
        self.upstream_ns = 0
        self.turns = 0

    # -- the response object ----------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        req, params = self.request, self.request.params
        done = self.status != "in_progress"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": False,
            "completed_at": self.completed_at if self.status == "completed" else None,
            "error": self.error,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.status == "incomplete" else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": params.get("max_output_tokens"),
            "max_tool_calls": req.max_tool_calls,
            "metadata": req.echo.get("metadata") or {},
            "model": req.model,
            "output": self.shown_output(),
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "previous_response_id": req.previous_response_id,
            "reasoning": params.get("reasoning"),
            "store": req.store,
            "temperature": params.get("temperature"),
            "text": params.get("text") or {"format": {"type": "text"}},
            "tool_choice": req.echo.get("tool_choice", "auto"),
            "tools": req.echo.get("tools") or [],
            "top_p": params.get("top_p"),
            "truncation": "disabled",
            "usage": self.usage.to_wire() if done else None,
            "user": params.get("user"),
        }

    def shown_output(self) -> list[dict[str, Any]]:
        """The output as the client sees it: native items, or OpenRouter's shapes when the
        shell came as ``openrouter:shell`` (the run itself keeps native items)."""
        if self.request.tools.openrouter:
            cid = self.container.id if self.container else None
            return openrouter.present_output(self.output, cid)
        return list(self.output)

    def client_events(self) -> AsyncGenerator[Event, None]:
        """``events()`` as the Responses API streams them to the client."""
        if not self.request.tools.openrouter:
            return self.events()
        cid = self.container.id if self.container else None
        return openrouter.EventMapper(cid).events(self.events())

    # -- driving ----------------------------------------------------------------------------

    async def events(
        self, *, raise_errors: bool = False, live: bool = True
    ) -> AsyncGenerator[Event, None]:
        """Every event of the run. A failure mid-run ends the stream with ``response.failed``,
        or, with ``raise_errors`` (the non-streamed form), raises. ``live``: the upstream is
        asked to stream, and the model's text is shown as it comes (the non-streamed form
        waits for whole answers instead)."""
        emit = Emitter()
        yield emit("response.created", response=self.response())
        yield emit("response.in_progress", response=self.response())
        try:
            async for event in self._loop(emit, live=live):
                yield event
        except ShellboxError as exc:
            if raise_errors:
                raise
            log.warning("response %s failed: %s", self.id, exc.message)
            self.status = "failed"
            self.error = {"code": "server_error", "message": exc.message}
            self._finish()
            yield emit("response.failed", response=self.response())
            return
        if self.status == "in_progress":
            self.status = "completed"
        self._finish()
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        yield emit(kind, response=self.response())

    async def result(self) -> dict[str, Any]:
        """The final response (errors raise)."""
        final: dict[str, Any] = {}
        try:
            async for event in self.events(raise_errors=True, live=False):
                final = event
        except UpstreamError as exc:
            if self.hosted_calls and exc.retryable is not False:
                msg = (
                    f"{exc.message} (after {self.hosted_calls} tool call(s) had run, which a "
                    "retry would run again)"
                )
                raise UpstreamFailedMidRun(msg) from None
            raise
        response: dict[str, Any] = final["response"]
        return response

    def _finish(self) -> None:
        self.completed_at = int(time.time())
        if self.on_finish is not None:
            self.on_finish(self)

    def _stop(self, reason: str) -> None:
        self.status = "incomplete"
        self.incomplete_reason = reason

    def _emit_item(self, emit: Emitter, item: dict[str, Any]) -> Iterator[Event]:
        index = len(self.output)
        self.output.append(item)
        yield from item_events(emit, index, item)

    async def _loop(self, emit: Emitter, *, live: bool) -> AsyncIterator[Event]:
        req = self.request
        while True:
            if self.turns >= self.caps.max_iterations:
                self._stop("max_tool_iterations")
                return
            self.turns += 1
            choice = req.tool_choice if self.turns == 1 else AUTO
            if req.max_tool_calls is not None and self.hosted_calls >= req.max_tool_calls:
                choice = NONE
            request = TurnRequest(
                self.instructions, self.history + self.output, req.tools, choice, req.params
            )
            base = len(self.output)  # where this turn's items start
            shown: list[Shown] = []
            turn: Turn | None = None
            async with aclosing(self._ask(request, live=live)) as parts:
                try:
                    async for part in parts:
                        if isinstance(part, Turn):
                            turn = part
                        else:
                            for event in self._show(emit, shown, part):
                                yield event
                    assert turn is not None  # the upstream's last part, or it raised
                    self._check_shown(shown, turn)
                except ShellboxError:
                    for message in shown:
                        if isinstance(message, LiveMessage):
                            message.item["status"] = "incomplete"  # cut off with the turn
                    raise
            self.upstream_ns += turn.elapsed_ns
            self.usage.add(turn.usage)
            calls = [i for i in turn.items if i["type"] in CALL_TYPES]
            problems = {id(turn.items[i]): why for i, why in turn.errors.items()}
            self._fresh_call_ids(calls)
            for n, item in enumerate(turn.items):
                if item["type"] == "shell_call":
                    item["environment"] = self._environment()
                elif item["type"] == "message" and not calls:
                    self._annotate(item)
                if n < len(shown):
                    events = self._finish_shown(emit, base + n, shown[n], item)
                else:
                    events = self._emit_item(emit, item)
                for event in events:
                    yield event
            if turn.incomplete_reason is not None:
                # The answer was cut off: its calls are not run (their arguments may be cut
                # too), and are answered so the conversation can go on.
                for call in calls:
                    note = f"not run: the model's answer was cut off ({turn.incomplete_reason})"
                    for event in self._emit_item(emit, error_output(call, note)):
                        yield event
                self._stop(turn.incomplete_reason)
                return
            if not calls:
                return
            to_client = False
            stop: str | None = None
            for call in calls:
                problem = problems.get(id(call))
                if problem is None and not self._hosted(call):
                    to_client = True
                    continue
                if problem is None and stop is None:
                    stop = self._exhausted()
                if problem is None and stop is not None:
                    problem = f"not run: {self._stop_text(stop)}"
                cap = req.max_tool_calls
                if problem is None and cap is not None and self.hosted_calls >= cap:
                    problem = f"not run: at most {cap} tool calls per response"
                if problem is not None:
                    for event in self._emit_item(emit, error_output(call, problem)):
                        yield event
                    continue
                async for event in self._execute(emit, call):
                    yield event
            if stop is not None:
                self._stop(stop)
                return
            if to_client:
                return

    # -- the model's turn, streamed ----------------------------------------------------------

    async def _ask(self, request: TurnRequest, *, live: bool) -> AsyncGenerator[TurnPart, None]:
        """One turn of the model: streamed when the run is, else one whole answer."""
        if live:
            async for part in self.upstream.stream_turn(self.target, request):
                yield part
        else:
            yield await self.upstream.turn(self.target, request)

    def _show(self, emit: Emitter, shown: list[Shown], part: Live) -> Iterator[Event]:
        """Shows what the model wrote before its turn ended. The upstream's reader only sends
        items in the turn's order, so each new one takes the next output index."""
        if isinstance(part, ItemDone):
            shown.append(part.item)
            yield from self._emit_item(emit, part.item)
            return
        assert isinstance(part, TextDelta)
        message = next(
            (m for m in shown if isinstance(m, LiveMessage) and m.id == part.item_id), None
        )
        if message is None:
            message = LiveMessage(len(self.output), part.item_id)
            shown.append(message)
            self.output.append(message.item)
            yield from message.open(emit)
        yield from message.delta(emit, part.content_index, part.delta)

    @staticmethod
    def _check_shown(shown: list[Shown], turn: Turn) -> None:
        """What was shown must be where the turn has it, since its output indices are out.
        The final item keeps the id it was shown with (a proxy may number them anew)."""
        for n, thing in enumerate(shown):
            item = thing.item if isinstance(thing, LiveMessage) else thing
            final = turn.items[n] if n < len(turn.items) else {}
            if final.get("type") != item["type"]:
                msg = (
                    f"the upstream's streamed answer does not match its final response: it "
                    f"streamed a {item['type']} as output item {n} of the turn, where the "
                    f"final response has {final.get('type') or 'nothing'}"
                )
                raise UpstreamError(msg)
            if "id" in item:
                final["id"] = item["id"]

    def _finish_shown(
        self, emit: Emitter, index: int, thing: Shown, item: dict[str, Any]
    ) -> Iterator[Event]:
        """The rest of the series of an item shown early, now that it is final (an item
        shown whole has had all its events)."""
        self.output[index] = item
        if isinstance(thing, LiveMessage):
            yield from thing.close(emit, item)

    # -- calls ------------------------------------------------------------------------------

    def _fresh_call_ids(self, calls: list[dict[str, Any]]) -> None:
        """Some servers number calls per turn (``call_0`` every time); a call_id must be
        unique in the conversation, so a repeated one is replaced."""
        for call in calls:
            if call["call_id"] in self.call_ids:
                call["call_id"] = new_id("call_")
            self.call_ids.add(call["call_id"])

    def _environment(self) -> dict[str, Any]:
        if self.container is None:
            return {"type": "local"}
        return {"type": "container_reference", "container_id": self.container.id}

    def _hosted(self, call: dict[str, Any]) -> bool:
        if self.container is None:
            return False
        kind = call["type"]
        if kind == "apply_patch_call":
            return "apply_patch_call" in self.calls.handlers
        return kind in ("shell_call", "local_shell_call")

    def _exhausted(self) -> str | None:
        if self.sandbox_ns >= self.caps.max_sandbox_ns:
            return "max_sandbox_time"
        if self.output_chars >= self.caps.max_output_chars:
            return "max_tool_output"
        return None

    def _stop_text(self, reason: str) -> str:
        if reason == "max_sandbox_time":
            return f"this response used its {self.caps.max_sandbox_ns / 1e9:g} s of sandbox time"
        return f"this response fed back its {self.caps.max_output_chars} characters of tool output"

    async def _execute(self, emit: Emitter, call: dict[str, Any]) -> AsyncIterator[Event]:
        assert self.container is not None
        started = time.perf_counter_ns()
        self.clock.start()
        try:
            if call["type"] == "shell_call":
                async for event in self._shell(emit, call):
                    yield event
                return
            try:
                if call["type"] == "local_shell_call":
                    out = await self.calls.local_shell_call(self.principal, self.container.id, call)
                else:
                    handler = self.calls.handlers["apply_patch_call"]
                    out = await handler(self.principal, self.container.id, call)
            except InvalidRequest as exc:
                out = error_output(call, f"invalid {call['type']}: {exc.message}")
            text = out.get("output")
            self.output_chars += len(text) if isinstance(text, str) else 0
            self._observe(call["type"], started, out)
            for event in self._emit_item(emit, out):
                yield event
        finally:
            self.sandbox_ns += time.perf_counter_ns() - started
            self.hosted_calls += 1

    async def _shell(self, emit: Emitter, call: dict[str, Any]) -> AsyncIterator[Event]:
        assert self.container is not None
        action = dict(call["action"])
        left_ms = max(1, (self.caps.max_sandbox_ns - self.sandbox_ns) // 1_000_000)
        timeout = action.get("timeout_ms")
        requested = timeout if isinstance(timeout, int) else None
        if self.calls.limits.timeout_ms(requested) > left_ms:  # the run's budget is the clamp
            action["timeout_ms"] = self.calls.limits.timeout_ms(requested, at_most=left_ms)
        item = {"type": "shell_call", "call_id": call["call_id"], "action": action}
        started = time.perf_counter_ns()
        index = len(self.output)
        events = cast(
            AsyncGenerator[Event, None],
            self.calls.shell_call_events(self.principal, self.container.id, item),
        )
        out: dict[str, Any] | None = None
        exec_started = exec_ended = 0
        try:
            async for event in events:
                kind = event["type"]
                if kind == "response.output_item.done":
                    out = event["item"]
                    break
                if kind == "response.output_item.added":
                    exec_started = time.perf_counter_ns()
                elif kind == "response.shell_call_output_content.done":
                    exec_ended = time.perf_counter_ns()
                fields = {k: v for k, v in event.items() if k not in FORWARDED}
                yield emit(kind, output_index=index, **fields)
        except InvalidRequest as exc:
            if exec_started:
                raise  # validation happens before anything runs; this is not the model's
            out = error_output(call, f"invalid shell call: {exc.message}")
            for event_ in self._emit_item(emit, out):
                yield event_
            return
        finally:
            await events.aclose()
        if out is None:
            msg = "the shell call ended without an output item"
            raise ShellboxError(msg)
        if exec_ended > exec_started > 0:
            self.exec_ns += exec_ended - exec_started
        for entry in out.get("output", []):
            self.output_chars += len(entry.get("stdout", "")) + len(entry.get("stderr", ""))
        for cite in out.get("files", []):
            self.citations.pop(cite["file_id"], None)
            self.citations[cite["file_id"]] = cite
        self._observe("shell_call", started, out)
        self.output.append(out)
        yield emit("response.output_item.done", output_index=index, item=out)

    def _observe(self, kind: str, started_ns: int, out: dict[str, Any]) -> None:
        if self.on_call is not None:
            self.on_call(kind, (time.perf_counter_ns() - started_ns) / 1e9, out)

    # -- files ------------------------------------------------------------------------------

    def _annotate(self, item: dict[str, Any]) -> None:
        """Cite the files this response's calls created on its final message (not with
        ``openrouter:shell``: there the files are cited on the call items only, as OpenRouter
        does)."""
        if not self.citations or self.container is None or self.request.tools.openrouter:
            return
        parts = [p for p in item.get("content", []) if p.get("type") == "output_text"]
        if not parts:
            return
        part = parts[-1]
        text = part.get("text", "")
        cid = self.container.id
        found = []
        for file_id in reversed(self.citations):  # newest first
            try:
                record = self.files.get_container_file(self.principal, cid, file_id)
            except FileNotFound:
                continue  # a later command removed it
            start, end = 0, 0
            for mention in (record.container_path, record.path, record.path.rsplit("/", 1)[-1]):
                at = text.find(mention)
                if at >= 0:
                    start, end = at, at + len(mention)
                    break
            found.append(
                {
                    "type": "container_file_citation",
                    "container_id": cid,
                    "file_id": file_id,
                    "filename": record.path.rsplit("/", 1)[-1],
                    "start_index": start,
                    "end_index": end,
                }
            )
            if len(found) >= MAX_ANNOTATIONS:
                break
        found.sort(key=lambda a: (a["start_index"], a["end_index"]))
        part["annotations"] = [*(part.get("annotations") or []), *found]

    # -- timing -----------------------------------------------------------------------------

    def timings(self) -> dict[str, float]:
        """Milliseconds spent waiting for the upstream and running commands."""
        return {"upstream": self.upstream_ns / 1e6, "exec": self.exec_ns / 1e6}
