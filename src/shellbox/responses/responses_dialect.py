"""The ``responses`` upstream dialect: the upstream's own Responses API, with the shell tool
in ``local`` mode, so OpenAI models emit native ``shell_call`` items that shellbox runs.

Every turn sends the whole conversation with ``store: false`` (the upstream keeps no state).
Output items are sent without their ids (shellbox or the client made them, not the
upstream), and assistant messages in their plain ``{role, content}`` form. Reasoning items
are sent back only when they carry ``encrypted_content`` (the only form a stateless upstream
accepts).

Streamed, the upstream's own Responses events come back: its ``output_text.delta`` events are
shown as they arrive, and the turn is read from the response of its final event
(``response.completed`` or ``response.incomplete``) by the non-streamed parser, so both forms
give the same turn.
"""

from __future__ import annotations

from typing import Any

from shellbox.responses import arguments
from shellbox.responses.items import CALL_TYPES, OUTPUT_TYPES, text_of
from shellbox.responses.tools import ToolChoice, ToolSet
from shellbox.responses.upstream import (
    ItemDone,
    Live,
    TextDelta,
    Turn,
    TurnRequest,
    UpstreamTarget,
    Usage,
    count,
    cut_short,
    malformed,
    reported_error,
    streamed_chunk,
)

PARAMS = (
    "temperature",
    "top_p",
    "max_output_tokens",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "user",
    "safety_identifier",
    "prompt_cache_key",
)
# Not sent back: output-only fields, and the container a hosted call ran in (the upstream
# was told the shell is local).
OUTPUT_ONLY = ("created_by", "files", "environment")


def tool_definitions(tools: ToolSet) -> list[dict[str, Any]]:
    defs: list[dict[str, Any]] = []
    if tools.shell:
        defs.append({"type": "shell", "environment": {"type": "local"}})
    if tools.apply_patch:
        defs.append({"type": "apply_patch"})
    if tools.local_shell:
        defs.append({"type": "local_shell"})
    for f in tools.functions.values():
        d: dict[str, Any] = {"type": "function", "name": f.name}
        if f.description:
            d["description"] = f.description
        d["parameters"] = f.parameters or {"type": "object", "properties": {}}
        if f.strict is not None:
            d["strict"] = f.strict
        defs.append(d)
    return defs


def tool_choice(choice: ToolChoice) -> Any:
    if choice.mode != "tool":
        return choice.mode
    if choice.name in ("shell", "apply_patch", "local_shell"):
        return {"type": choice.name}
    return {"type": "function", "name": choice.name}


def upstream_item(item: dict[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    if kind == "message":
        if item["role"] == "assistant":
            # As an "easy" message: an output message with no id is not valid input.
            return {"role": "assistant", "content": text_of(item["content"])}
        return {"role": item["role"], "content": item["content"]}
    if kind == "reasoning":
        return dict(item) if item.get("encrypted_content") else None
    if kind in CALL_TYPES or kind in OUTPUT_TYPES:
        out = {k: v for k, v in item.items() if k not in OUTPUT_ONLY}
        if kind in OUTPUT_TYPES:
            out.pop("id", None)  # ours (or the client's), not the upstream's
        if kind == "shell_call_output":
            out["output"] = [
                {"stdout": e["stdout"], "stderr": e["stderr"], "outcome": e["outcome"]}
                for e in item.get("output", [])
            ]
        return out
    return None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def output_item(raw: Any, tools: ToolSet) -> tuple[dict[str, Any] | None, str | None]:
    """One of the upstream's output items as the turn keeps it (None: an item of a tool we
    did not offer, left out), and why it cannot run when it is a call that cannot."""
    if not isinstance(raw, dict):
        msg = "an output item is not an object"
        raise malformed(msg)
    item = {k: v for k, v in raw.items() if k != "created_by"}
    kind = item.get("type")
    error = None
    action = _object(item.get("action"))
    if kind == "shell_call":
        item["action"], error = arguments.shell_action(action)
    elif kind == "local_shell_call":
        item["action"], error = arguments.local_shell_action(action)
    elif kind == "apply_patch_call":
        op = _object(item.get("operation"))
        args = {"operation": op.get("type"), "path": op.get("path"), "diff": op.get("diff")}
        item["operation"], error = arguments.patch_operation(args)
    elif kind == "function_call":
        if item.get("name") not in tools.functions:
            error = f"there is no tool named {item.get('name')!r}"
    elif kind not in ("message", "reasoning"):
        return None, None  # nothing to do with it
    if kind in CALL_TYPES and (not isinstance(item.get("call_id"), str) or not item["call_id"]):
        msg = f"a {kind} has no call_id"
        raise malformed(msg)
    return item, error


class ResponsesDialect:
    path = "/responses"

    def payload(self, target: UpstreamTarget, req: TurnRequest) -> dict[str, Any]:
        items = [u for u in map(upstream_item, req.items) if u is not None]
        body: dict[str, Any] = {"model": target.model, "input": items, "store": False}
        if req.instructions:
            body["instructions"] = req.instructions
        defs = tool_definitions(req.tools)
        if defs:
            body["tools"] = defs
            body["tool_choice"] = tool_choice(req.tool_choice)
        for key in PARAMS:
            if req.params.get(key) is not None:
                body[key] = req.params[key]
        return body

    def stream_fields(self) -> dict[str, Any]:
        return {"stream": True}

    def reader(self, tools: ToolSet) -> ResponsesStreamReader:
        return ResponsesStreamReader(self, tools)

    def parse(self, body: Any, tools: ToolSet) -> Turn:
        if not isinstance(body, dict):
            msg = "it is not a JSON object"
            raise malformed(msg)
        failure = body.get("error")
        if body.get("status") == "failed" or failure:
            why = failure.get("message") if isinstance(failure, dict) else None
            msg = f"the response failed: {why or 'no reason given'}"
            raise malformed(msg)
        output = body.get("output")
        if not isinstance(output, list):
            msg = "it has no output list"
            raise malformed(msg)
        turn = Turn(items=[])
        for raw in output:
            item, error = output_item(raw, tools)
            if item is None:
                continue
            if error:
                turn.errors[len(turn.items)] = error
            turn.items.append(item)
        if body.get("status") == "incomplete":
            details = body.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            turn.incomplete_reason = str(reason or "max_output_tokens")
        usage = _object(body.get("usage"))
        turn.usage = Usage(
            count(usage.get("input_tokens")),
            count(usage.get("output_tokens")),
            count(_object(usage.get("input_tokens_details")).get("cached_tokens")),
            count(_object(usage.get("output_tokens_details")).get("reasoning_tokens")),
        )
        return turn


FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class ResponsesStreamReader:
    """The upstream's Responses events. Its items are shown only in their order: a message's
    text streams when every item before it was shown (a reasoning item is, when it is done);
    anything else holds the rest back for the end of the turn, which shows it whole."""

    def __init__(self, dialect: ResponsesDialect, tools: ToolSet) -> None:
        self.dialect = dialect
        self.tools = tools
        self.shown = 0  # the upstream's output items [0, shown) are shown
        self.messages: dict[int, str] = {}  # output_index -> id, of messages whose text streams
        self.turn: Turn | None = None

    @property
    def complete(self) -> bool:
        return self.turn is not None

    def feed(self, event: str, data: str) -> list[Live]:
        if self.turn is not None:
            return []
        chunk = streamed_chunk(data)
        kind = chunk.get("type") or event
        if kind == "error":
            raise reported_error(chunk.get("error") or chunk)
        if kind in FINAL_EVENTS:
            # A failed response raises here, as the same response would unstreamed.
            self.turn = self.dialect.parse(chunk.get("response"), self.tools)
        elif kind == "response.output_text.delta":
            return self._text(chunk)
        elif kind == "response.output_item.done":
            return self._done(chunk)
        return []

    def _text(self, chunk: dict[str, Any]) -> list[Live]:
        index, item_id, part, delta = (
            chunk.get(k) for k in ("output_index", "item_id", "content_index", "delta")
        )
        if not (isinstance(index, int) and isinstance(item_id, str) and isinstance(part, int)):
            return []  # cannot be placed: the final response has the text
        if not isinstance(delta, str) or not delta:
            return []
        if index not in self.messages:
            if index != self.shown:
                return []  # an item before it is not shown yet
            self.messages[index] = item_id
            self.shown += 1
        return [TextDelta(self.messages[index], part, delta)]

    def _done(self, chunk: dict[str, Any]) -> list[Live]:
        raw = chunk.get("item")
        if chunk.get("output_index") != self.shown or _object(raw).get("type") != "reasoning":
            return []
        item, _ = output_item(raw, self.tools)
        if item is None:
            return []
        self.shown += 1
        return [ItemDone(item)]

    def finish(self) -> Turn:
        if self.turn is None:
            final = "its final event (response.completed)"
            raise cut_short(final)
        return self.turn
