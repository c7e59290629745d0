"""The Anthropic Messages shape (``POST /v1/messages``) over the same tool loop.

**Shell tool.** ``{"type": "shell_20250101", "name": "shell"}``, optionally with an
``environment`` as OpenAI's shell tool takes it (``container_auto`` with ``memory_limit``,
``network_policy``, ``skills``, ``file_ids``; or ``container_reference``). It is a server
tool: without an environment a container is created for the request. The request-level
``container`` (an id, or ``{"id": ...}``) continues in an existing container, as the
Messages API does for its code execution tool; the response's ``container`` names the one
used.

**Output.** Each shell call is a ``server_tool_use`` block named ``shell`` (``input``:
``{commands, timeout_ms?, max_output_length?}``), followed by its result::

    {"type": "shell_tool_result", "tool_use_id": "<the server_tool_use id>",
     "content": {"type": "shell_result",
                 "output": [{"stdout": "...", "stderr": "...",
                             "outcome": {"type": "exit", "exit_code": 0}}],
                 "max_output_length": 16384,
                 "files": [<container_file_citation>, ...]}}

one ``output`` entry per command, in order (a timed-out command has
``{"type": "timeout"}``). Both blocks can be sent back in later ``messages`` as they are.
Custom tools (``{name, description, input_schema}``) go back to the client as ``tool_use``
blocks (``stop_reason: "tool_use"``) and are answered with ``tool_result`` blocks.
``stop_reason`` is ``pause_turn`` when a loop cap stopped the run: send the conversation back
to let the model go on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.responses.items import text_of
from shellbox.responses.loop import LoopRequest, Run
from shellbox.responses.tools import OPENROUTER_SHELL, parse_tool_choice, parse_tools

SHELL_TOOL_TYPES = ("shell_20250101",)
OPENROUTER_RESULT = "openrouter_shell_tool_result"
CUSTOM_TOOL_TYPES = (None, "custom")
STOP_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}

SseEvent = tuple[str, dict[str, Any]]


def _fail(msg: str, param: str) -> InvalidRequest:
    return InvalidRequest(msg, param=param)


# -- request ----------------------------------------------------------------------------------


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        msg = "tools must be a list"
        raise _fail(msg, "tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else "?"
        if not isinstance(tool, dict):
            msg = "each tool must be an object"
            raise _fail(msg, f"tools[{i}]")
        if kind in SHELL_TOOL_TYPES:
            if tool.get("name", "shell") != "shell":
                msg = "the shell tool must be named 'shell'"
                raise _fail(msg, f"tools[{i}].name")
            env = tool.get("environment") or {"type": "container_auto"}
            if isinstance(env, dict) and env.get("type") == "local":
                msg = "the shell server tool runs in a container; 'local' is not available here"
                raise _fail(msg, f"tools[{i}].environment")
            out.append({"type": "shell", "environment": env})
        elif kind == OPENROUTER_SHELL:
            out.append(tool)  # checked by parse_tools, as on the Responses API
        elif kind in CUSTOM_TOOL_TYPES:
            out.append(
                {
                    "type": "function",
                    "name": tool.get("name"),
                    "description": tool.get("description"),
                    "parameters": tool.get("input_schema"),
                }
            )
        else:
            msg = (
                f"tool type {kind!r} is not supported here; this server offers the shell "
                f"server tool ({SHELL_TOOL_TYPES[0]} or {OPENROUTER_SHELL}) and custom tools"
            )
            raise _fail(msg, f"tools[{i}].type")
    container = body.get("container")
    if isinstance(container, dict):
        container = container.get("id")
    if container is not None:
        at = next((n for n, t in enumerate(out) if t["type"] in ("shell", OPENROUTER_SHELL)), None)
        if not isinstance(container, str) or at is None:
            msg = "container must be a container id, and needs the shell tool in tools"
            raise _fail(msg, "container")
        reference = {"type": "container_reference", "container_id": container}
        shell = out[at]
        if shell["type"] == OPENROUTER_SHELL:
            params = shell.get("parameters")
            params = params if isinstance(params, dict) else {}
            out[at] = {**shell, "parameters": {**params, "environment": reference}}
        else:
            shell["environment"] = reference
    return out


def _tool_choice(value: Any) -> Any:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value.get("name"), str):
        name = value["name"]
        if name in ("shell", OPENROUTER_SHELL):
            return {"type": name}
        return {"type": "function", "name": name}
    msg = "tool_choice must be {type: auto | any | none} or {type: tool, name}"
    raise _fail(msg, "tool_choice")


def _system(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        return "\n\n".join(
            b.get("text", "") for b in value if isinstance(b, dict) and b.get("type") == "text"
        )
    msg = "system must be a string or a list of text blocks"
    raise _fail(msg, "system")


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _image(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        msg = "an image block needs a base64 or url source"
        raise _fail(msg, param)
    return {"type": "input_image", "image_url": url}


def _shell_result_item(block: dict[str, Any]) -> dict[str, Any]:
    result = block.get("content")
    entries = result.get("output") if isinstance(result, dict) else None
    output = []
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            stdout, stderr = str(e.get("stdout") or ""), str(e.get("stderr") or "")
            outcome = e.get("outcome") or {"type": "exit", "exit_code": 0}
            output.append({"stdout": stdout, "stderr": stderr, "outcome": outcome})
    return {"type": "shell_call_output", "call_id": str(block.get("tool_use_id")), "output": output}


def _flush(items: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    """Close the message the text and image blocks so far make."""
    if parts:
        content: Any = text_of(parts) if role == "assistant" else list(parts)
        items.append({"type": "message", "role": role, "content": content})
        parts.clear()


def messages_to_items(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        msg = "messages must be a non-empty list"
        raise _fail(msg, "messages")
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            msg = "each message needs role 'user' or 'assistant'"
            raise _fail(msg, f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            msg = "content must be a string or a list of blocks"
            raise _fail(msg, f"{param}.content")
        parts: list[dict[str, Any]] = []

        for j, block in enumerate(content):
            where = f"{param}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text_kind = "output_text" if role == "assistant" else "input_text"
                parts.append({"type": text_kind, "text": str(block.get("text", ""))})
            elif kind == "image" and role == "user":
                parts.append(_image(block, where))
            elif kind == "tool_result" and role == "user":
                _flush(items, role, parts)
                text = _result_text(block.get("content"))
                if block.get("is_error"):
                    text = f"error: {text}"
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": str(block.get("tool_use_id")),
                        "output": text,
                    }
                )
            elif kind in ("tool_use", "server_tool_use") and role == "assistant":
                _flush(items, role, parts)
                tool_input = block.get("input") if isinstance(block.get("input"), dict) else {}
                call_id = str(block.get("id"))
                if kind == "server_tool_use":
                    action = {k: tool_input.get(k) for k in ("timeout_ms", "max_output_length")}
                    action["commands"] = tool_input.get("commands") or []
                    items.append(
                        {
                            "type": "shell_call",
                            "call_id": call_id,
                            "action": action,
                            "status": "completed",
                        }
                    )
                else:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": call_id,
                            "name": str(block.get("name")),
                            "arguments": json.dumps(tool_input, ensure_ascii=False),
                            "status": "completed",
                        }
                    )
            elif kind in ("shell_tool_result", OPENROUTER_RESULT) and role == "assistant":
                _flush(items, role, parts)
                items.append(_shell_result_item(block))
            elif kind in ("thinking", "redacted_thinking"):
                continue  # another model's reasoning: not replayed
            else:
                msg = f"content block type {kind!r} is not supported in a {role} message"
                raise _fail(msg, f"{where}.type")
        _flush(items, role, parts)
    return items


def parse_messages_request(body: dict[str, Any]) -> tuple[LoopRequest, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        msg = "model is required"
        raise _fail(msg, "model")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        msg = "max_tokens must be a positive integer"
        raise _fail(msg, "max_tokens")
    tools = parse_tools(_tools(body))
    params: dict[str, Any] = {}
    if max_tokens is not None:
        params["max_output_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), int | float):
            params[key] = body[key]
    if isinstance(body.get("stop_sequences"), list) and body["stop_sequences"]:
        params["stop"] = body["stop_sequences"]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
        params["parallel_tool_calls"] = False
    request = LoopRequest(
        model=model,
        input_items=messages_to_items(body.get("messages")),
        instructions=_system(body.get("system")),
        tools=tools,
        tool_choice=parse_tool_choice(_tool_choice(choice), tools),
        store=False,
        params=params,
    )
    return request, bool(body.get("stream"))


# -- response ---------------------------------------------------------------------------------


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def block(item: dict[str, Any], run: Run | None = None) -> dict[str, Any] | None:
    """The content block an output item appears as (None: not shown). With a run whose shell
    came as ``openrouter:shell``, shell calls show in OpenRouter's blocks."""
    kind = item["type"]
    if (
        run is not None
        and run.request.tools.openrouter
        and kind in ("shell_call", "shell_call_output")
    ):
        return openrouter_block(item, run.container.id if run.container else None)
    if kind == "message":
        text = text_of(item.get("content"))
        return {"type": "text", "text": text, "citations": None} if text else None
    if kind == "shell_call":
        action = item["action"]
        shown = {"commands": action["commands"]}
        shown.update({k: action[k] for k in ("timeout_ms", "max_output_length") if action.get(k)})
        return {"type": "server_tool_use", "id": item["call_id"], "name": "shell", "input": shown}
    if kind == "shell_call_output":
        content: dict[str, Any] = {"type": "shell_result", "output": item.get("output", [])}
        if item.get("max_output_length") is not None:
            content["max_output_length"] = item["max_output_length"]
        content["files"] = item.get("files") or []
        return {"type": "shell_tool_result", "tool_use_id": item["call_id"], "content": content}
    if kind == "function_call":
        return {
            "type": "tool_use",
            "id": item["call_id"],
            "name": item["name"],
            "input": _arguments(item.get("arguments")),
        }
    return None  # reasoning; outputs shellbox wrote for calls it refused


def openrouter_block(item: dict[str, Any], cid: str | None) -> dict[str, Any]:
    """OpenRouter's blocks: the call is a ``server_tool_use`` named ``openrouter:shell``; its
    result an ``openrouter_shell_tool_result`` whose content mirrors the native
    ``shell_tool_result``'s, with the ``container_id`` the commands ran in."""
    native = block(item)
    assert native is not None
    if item["type"] == "shell_call":
        return {**native, "name": OPENROUTER_SHELL}
    content = {
        "type": "openrouter_shell_result",
        "output": native["content"]["output"],
        "max_output_length": item.get("max_output_length"),
        "container_id": cid,
        "files": native["content"]["files"],
    }
    return {"type": OPENROUTER_RESULT, "tool_use_id": item["call_id"], "content": content}


def _answered(output: list[dict[str, Any]]) -> set[str]:
    return {i["call_id"] for i in output if i["type"] == "function_call_output"}


def stop_reason(run: Run) -> str:
    if run.status == "incomplete":
        return STOP_REASONS.get(run.incomplete_reason or "", "pause_turn")
    answered = _answered(run.output)
    pending = [i for i in run.output if i["type"] == "function_call"]
    if any(i["call_id"] not in answered for i in pending):
        return "tool_use"
    return "end_turn"


def usage(run: Run) -> dict[str, Any]:
    u = run.usage
    return {
        "input_tokens": max(u.input_tokens - u.cached_tokens, 0),
        "output_tokens": u.output_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def container_info(run: Run) -> dict[str, Any] | None:
    c = run.container
    if c is None:
        return None
    last_active = datetime.fromtimestamp(run.completed_at or run.created_at, UTC)
    expires = last_active + timedelta(minutes=c.expires_after_minutes)
    return {"id": c.id, "expires_at": expires.isoformat().replace("+00:00", "Z")}


def _blocks(run: Run) -> list[dict[str, Any]]:
    """Blocks in output order, except ``tool_use``: the client's calls come last (a call of a
    tool that does not exist, already answered with an error, is left out)."""
    answered = _answered(run.output)
    shown = [block(i, run) for i in run.output if i["type"] != "function_call"]
    calls = [
        block(i)
        for i in run.output
        if i["type"] == "function_call" and i["call_id"] not in answered
    ]
    return [b for b in (*shown, *calls) if b is not None]


def message(run: Run, message_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": run.request.model,
        "content": _blocks(run),
        "stop_reason": stop_reason(run),
        "stop_sequence": None,
        "usage": usage(run),
        "container": container_info(run),
    }


def _block_events(index: int, b: dict[str, Any]) -> list[SseEvent]:
    delta: dict[str, Any] | None
    if b["type"] == "text":
        start = {**b, "text": ""}
        delta = {"type": "text_delta", "text": b["text"]}
    elif b["type"] in ("server_tool_use", "tool_use"):
        start = {**b, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
    else:
        start, delta = b, None
    events: list[SseEvent] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    if delta is not None:
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


class _TextBlock:
    """The one text block that streams at a time: a message's, from its first text to its
    item's end. A message whose text starts while another streams is sent whole when done."""

    def __init__(self) -> None:
        self.streaming: int | None = None  # the output index of the message that streams
        self.whole: set[int] = set()

    def delta(self, block_index: int, output_index: int, text: str) -> list[SseEvent]:
        events: list[SseEvent] = []
        if self.streaming is None and output_index not in self.whole:
            self.streaming = output_index
            start = {"type": "text", "text": "", "citations": None}
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": block_index, "content_block": start},
                )
            )
        if self.streaming != output_index:
            self.whole.add(output_index)
            return events
        delta = {"type": "text_delta", "text": text}
        events.append(
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": block_index, "delta": delta},
            )
        )
        return events

    def stop(self, block_index: int) -> SseEvent:
        self.streaming = None
        return "content_block_stop", {"type": "content_block_stop", "index": block_index}


async def stream_events(run: Run, message_id: str) -> AsyncGenerator[SseEvent, None]:
    """The Messages streaming events of a run. A text block streams as the model writes it;
    other blocks are sent when their item is done; ``tool_use`` blocks wait for the end, since
    only then is it known which went unanswered."""
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": run.request.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "container": None,
    }
    yield "message_start", {"type": "message_start", "message": start}
    index = 0
    text = _TextBlock()
    events = run.events()
    try:
        async for event in events:
            if event["type"] == "response.failed":
                why = run.error["message"] if run.error else ""
                yield "error", {"type": "error", "error": {"type": "api_error", "message": why}}
                return
            if event["type"] == "response.output_text.delta":
                for e in text.delta(index, event["output_index"], event["delta"]):
                    yield e
                continue
            if event["type"] != "response.output_item.done":
                continue
            if text.streaming == event["output_index"]:
                yield text.stop(index)
                index += 1
                continue
            item = event["item"]
            b = None if item["type"] == "function_call" else block(item, run)
            if b is not None:
                for e in _block_events(index, b):
                    yield e
                index += 1
    finally:
        await events.aclose()  # a client that left: the running command is killed
    answered = _answered(run.output)
    for item in run.output:
        if item["type"] == "function_call" and item["call_id"] not in answered:
            for e in _block_events(index, block(item) or {}):
                yield e
            index += 1
    delta = {
        "stop_reason": stop_reason(run),
        "stop_sequence": None,
        "container": container_info(run),
    }
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": usage(run)}
    yield "message_stop", {"type": "message_stop"}


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
