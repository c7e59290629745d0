"""The ``chat`` upstream dialect: Chat Completions, with the built-in tools offered as
functions, so any OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM) can drive them.

* ``shell(commands: string[], timeout_ms?, max_output_length?)`` -> ``shell_call``
* ``apply_patch(operation, path, diff?)`` -> ``apply_patch_call``
* ``local_shell(command: string[], env?, timeout_ms?, working_directory?)`` -> ``local_shell_call``

Tool outputs go back as ``tool`` messages: a shell call's as the JSON
``{"output": [{"stdout", "stderr", "outcome"}, ...]}``, one entry per command.

Streamed, the answer comes as ``chat.completion.chunk`` events (asked with
``stream_options.include_usage``, so the last one carries the usage) ending with
``data: [DONE]``; ``ChatStreamReader`` puts them back together into the completion the
non-streamed parser reads, so both forms give the same turn.
"""

from __future__ import annotations

import json
from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.responses import arguments
from shellbox.responses.items import CALL_TYPES, OUTPUT_TYPES, assistant_message, text_of
from shellbox.responses.tools import ToolChoice, ToolSet
from shellbox.responses.upstream import (
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

SHELL_HOSTED = (
    "Run shell commands in a sandboxed Linux container. Each command runs in its own bash "
    "invocation, in order, in /mnt/data; a failing command does not stop the next. Returns "
    "each command's stdout, stderr and exit code."
)
SHELL_LOCAL = (
    "Run shell commands on the user's machine. Each command runs in its own shell "
    "invocation, in order. Returns each command's stdout, stderr and exit code."
)
SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "commands": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Shell command lines to run, in order.",
        },
        "timeout_ms": {
            "type": "integer",
            "description": "Time limit for each command, in milliseconds (optional).",
        },
        "max_output_length": {
            "type": "integer",
            "description": "Most characters of stdout and of stderr kept per command (optional).",
        },
    },
    "required": ["commands"],
}
APPLY_PATCH = (
    "Create, update or delete a text file with a V4A diff. create_file: every line of the "
    "diff starts with '+'. update_file: hunks that start with '@@ <a line near the change>', "
    "then lines starting with ' ' (context), '-' (removed) or '+' (added). delete_file: no diff."
)
APPLY_PATCH_PARAMETERS = {
    "type": "object",
    "properties": {
        "operation": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
        "path": {"type": "string", "description": "The file, relative to the working directory."},
        "diff": {"type": "string", "description": "The V4A diff (not for delete_file)."},
    },
    "required": ["operation", "path"],
}
LOCAL_SHELL = "Run one command (an argv list) and return its output."
LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The argv."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeout_ms": {"type": "integer"},
        "working_directory": {"type": "string"},
    },
    "required": ["command"],
}
EXAMPLES = {
    "shell": arguments.SHELL_EXAMPLE,
    "apply_patch": arguments.PATCH_EXAMPLE,
    "local_shell": arguments.LOCAL_SHELL_EXAMPLE,
}
PARAMS = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}


def _function(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def tool_definitions(tools: ToolSet) -> list[dict[str, Any]]:
    defs = []
    if tools.shell:
        desc = SHELL_HOSTED if tools.hosted else SHELL_LOCAL
        defs.append(_function("shell", desc, SHELL_PARAMETERS))
    if tools.apply_patch:
        defs.append(_function("apply_patch", APPLY_PATCH, APPLY_PATCH_PARAMETERS))
    if tools.local_shell:
        defs.append(_function("local_shell", LOCAL_SHELL, LOCAL_SHELL_PARAMETERS))
    for f in tools.functions.values():
        d = _function(f.name, f.description, f.parameters)
        if f.strict is not None:
            d["function"]["strict"] = f.strict
        defs.append(d)
    return defs


def tool_choice(choice: ToolChoice) -> Any:
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def _content(content: Any) -> Any:
    """Message content for Chat Completions: a string, or text and image_url parts."""
    if isinstance(content, str):
        return content
    if all(p.get("type") in ("input_text", "output_text", "text", "refusal") for p in content):
        return text_of(content)
    parts: list[dict[str, Any]] = []
    for p in content:
        kind = p.get("type")
        if kind == "input_image" and isinstance(p.get("image_url"), str):
            image: dict[str, Any] = {"url": p["image_url"]}
            if p.get("detail") in ("low", "high", "auto"):
                image["detail"] = p["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": p.get("text", "")})
        else:
            msg = (
                f"{kind} content (other than images given by URL) cannot be sent to this "
                "model's upstream, which speaks Chat Completions"
            )
            raise InvalidRequest(msg, param="input")
    return parts


def _call_name_and_arguments(item: dict[str, Any]) -> tuple[str, str]:
    kind = item["type"]
    if kind == "shell_call":
        action = item.get("action") or {}
        args: dict[str, Any] = {"commands": action.get("commands", [])}
        for key in ("timeout_ms", "max_output_length"):
            if action.get(key) is not None:
                args[key] = action[key]
        return "shell", json.dumps(args, ensure_ascii=False)
    if kind == "apply_patch_call":
        op = item.get("operation") or (item.get("operations") or [{}])[0]
        args = {"operation": op.get("type"), "path": op.get("path")}
        if "diff" in op:
            args["diff"] = op["diff"]
        return "apply_patch", json.dumps(args, ensure_ascii=False)
    if kind == "local_shell_call":
        action = item.get("action") or {}
        args = {"command": action.get("command", [])}
        for key in ("env", "timeout_ms", "working_directory"):
            if action.get(key):
                args[key] = action[key]
        return "local_shell", json.dumps(args, ensure_ascii=False)
    return str(item.get("name")), str(item.get("arguments") or "{}")


def tool_result_text(item: dict[str, Any]) -> str:
    """How a tool output reads to the model."""
    kind = item["type"]
    if kind == "shell_call_output":
        entries = [
            {"stdout": e["stdout"], "stderr": e["stderr"], "outcome": e["outcome"]}
            for e in item.get("output", [])
        ]
        return json.dumps({"output": entries}, ensure_ascii=False)
    if kind == "apply_patch_call_output":
        return json.dumps(
            {"status": item.get("status"), "output": item.get("output") or ""}, ensure_ascii=False
        )
    output = item.get("output")
    return output if isinstance(output, str) else text_of(output)


def messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            if role == "assistant":
                out.append({"role": "assistant", "content": text_of(item["content"])})
            else:
                out.append({"role": role, "content": _content(item["content"])})
        elif kind in CALL_TYPES:
            name, args = _call_name_and_arguments(item)
            call = {"id": item["call_id"], "type": "function", "function": {"name": name}}
            call["function"]["arguments"] = args
            last = out[-1] if out else None
            # Calls of one model turn share its assistant message.
            if last is not None and last["role"] == "assistant":
                if not last["content"]:
                    last["content"] = None
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in OUTPUT_TYPES:
            out.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": tool_result_text(item)}
            )
        # reasoning items belong to another model's API: not sent
    return out


def call_item(
    name: Any, raw: Any, call_id: str, tools: ToolSet
) -> tuple[dict[str, Any], str | None]:
    """The Responses item for one function call of the model, and why it cannot run."""
    args, error = arguments.decode(raw)
    builtin = isinstance(name, str) and name in EXAMPLES and name in tools.names()
    if builtin and error is not None:
        error = f"invalid {name} call: {error}. Call it like {EXAMPLES[name]}."
    if builtin and name == "shell":
        action, problem = arguments.shell_action(args)
        item = {"type": "shell_call", "id": new_id("sh_"), "call_id": call_id, "action": action}
    elif builtin and name == "apply_patch":
        op, problem = arguments.patch_operation(args)
        item = {"type": "apply_patch_call", "id": new_id("apc_"), "call_id": call_id}
        item["operation"] = op
    elif builtin and name == "local_shell":
        action, problem = arguments.local_shell_action(args)
        item = {"type": "local_shell_call", "id": new_id("lsh_"), "call_id": call_id}
        item["action"] = action
    else:
        text = raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})
        item = {"type": "function_call", "id": new_id("fc_"), "call_id": call_id}
        item.update(name=str(name or ""), arguments=text)
        problem = None
        if name not in tools.functions:
            error = (
                f"there is no tool named {name!r}; the tools are: {', '.join(tools.names())}"
                if tools
                else f"there is no tool named {name!r}: no tools are available"
            )
    item["status"] = "completed"
    return item, error or problem


class ChatDialect:
    path = "/chat/completions"

    def payload(self, target: UpstreamTarget, req: TurnRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": target.model,
            "messages": messages(req.instructions, req.items),
        }
        defs = tool_definitions(req.tools)
        if defs:
            body["tools"] = defs
            body["tool_choice"] = tool_choice(req.tool_choice)
            if req.params.get("parallel_tool_calls") is False:
                body["parallel_tool_calls"] = False
        for ours, theirs in PARAMS.items():
            if req.params.get(ours) is not None:
                body[theirs] = req.params[ours]
        if req.params.get("stop"):
            body["stop"] = req.params["stop"]
        return body

    def parse(self, body: Any, tools: ToolSet) -> Turn:
        return parse_completion(body, tools)

    def stream_fields(self) -> dict[str, Any]:
        return {"stream": True, "stream_options": {"include_usage": True}}

    def reader(self, tools: ToolSet) -> ChatStreamReader:
        return ChatStreamReader(tools)


def parse_completion(body: Any, tools: ToolSet, *, message_id: str | None = None) -> Turn:
    """The turn a chat completion gives (its message gets ``message_id``, when given: the id
    its streamed text was shown under)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        msg = "it has no choices"
        raise malformed(msg)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        msg = "choices[0].message is missing"
        raise malformed(msg)
    turn = Turn(items=[])
    text = text_of(message.get("content"))
    if text.strip():
        turn.items.append(assistant_message(text, item_id=message_id))
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        msg = "tool_calls is not a list"
        raise malformed(msg)
    for tc in tool_calls:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            msg = "a tool call has no function"
            raise malformed(msg)
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc["id"] else None
        item, error = call_item(
            fn.get("name"), fn.get("arguments"), call_id or new_id("call_"), tools
        )
        if error:
            turn.errors[len(turn.items)] = error
        turn.items.append(item)
    finish = choices[0].get("finish_reason")
    if finish == "length":
        turn.incomplete_reason = "max_output_tokens"
    elif finish == "content_filter":
        turn.incomplete_reason = "content_filter"
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    turn.usage = Usage(
        count(usage.get("prompt_tokens")),
        count(usage.get("completion_tokens")),
        count(prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else 0),
        count(
            completion_details.get("reasoning_tokens")
            if isinstance(completion_details, dict)
            else 0
        ),
    )
    return turn


class ChatStreamReader:
    """A streamed chat completion, chunk by chunk. The text is shown as it comes, once it is
    more than white space (which alone makes no message); the tool calls' pieces are joined
    by their ``index``; ``finish`` parses the completion it all adds up to."""

    def __init__(self, tools: ToolSet) -> None:
        self.tools = tools
        self.message_id = new_id("msg_")  # the message's id, from its first shown text on
        self.text: list[str] = []
        self.shown = False
        self.calls: dict[int, dict[str, Any]] = {}  # index -> {"id", "name", "arguments"}
        self.choice = False  # some chunk carried the first choice
        self.finish_reason: Any = None
        self.usage: Any = None
        self.done = False

    @property
    def complete(self) -> bool:
        return self.done

    def feed(self, event: str, data: str) -> list[Live]:
        if self.done:
            return []  # nothing counts after [DONE]
        if data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = streamed_chunk(data)
        if chunk.get("error"):
            raise reported_error(chunk["error"])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]  # the last chunk's, with include_usage
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            msg = "a streamed chunk's choices is not a list"
            raise malformed(msg)
        shown: list[Live] = []
        for choice in choices:
            if not isinstance(choice, dict):
                msg = "a streamed chunk's choice is not an object"
                raise malformed(msg)
            if choice.get("index", 0) != 0:
                continue  # only the first choice is read, as when not streamed
            self.choice = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                msg = "a streamed chunk's delta is not an object"
                raise malformed(msg)
            self._tool_calls(delta.get("tool_calls"))
            shown.extend(self._text(text_of(delta.get("content"))))
        return shown

    def _text(self, piece: str) -> list[Live]:
        if not piece:
            return []
        self.text.append(piece)
        if self.shown:
            return [TextDelta(self.message_id, 0, piece)]
        so_far = "".join(self.text)
        if not so_far.strip():
            return []
        self.shown = True
        return [TextDelta(self.message_id, 0, so_far)]

    def _tool_calls(self, pieces: Any) -> None:
        """The first piece of a call has its id and name (some servers repeat them: the
        first is kept); its arguments come in pieces."""
        if pieces is None:
            return
        if not isinstance(pieces, list):
            msg = "a streamed chunk's tool_calls is not a list"
            raise malformed(msg)
        for position, piece in enumerate(pieces):
            if not isinstance(piece, dict):
                msg = "a streamed tool call is not an object"
                raise malformed(msg)
            index = piece.get("index")
            key = index if isinstance(index, int) else position
            call = self.calls.setdefault(key, {"id": None, "name": None, "arguments": []})
            if piece.get("id") and call["id"] is None:
                call["id"] = piece["id"]
            fn = piece.get("function") or {}
            if not isinstance(fn, dict):
                msg = "a streamed tool call's function is not an object"
                raise malformed(msg)
            if fn.get("name") and call["name"] is None:
                call["name"] = fn["name"]
            args = fn.get("arguments")
            if isinstance(args, str):
                call["arguments"].append(args)
            elif args is not None:
                call["arguments"].append(json.dumps(args, ensure_ascii=False))

    def finish(self) -> Turn:
        # Some servers close the stream after the chunk with the finish_reason without a
        # [DONE] line; an answer without either was cut short.
        if not self.done and self.finish_reason is None:
            final = "its finish_reason and [DONE] line"
            raise cut_short(final)
        tool_calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": _joined(call["arguments"])},
            }
            for _, call in sorted(self.calls.items())
        ]
        message = {"role": "assistant", "content": "".join(self.text), "tool_calls": tool_calls}
        choices = [{"message": message, "finish_reason": self.finish_reason}] if self.choice else []
        body = {"choices": choices, "usage": self.usage}
        return parse_completion(body, self.tools, message_id=self.message_id)


def _joined(pieces: list[str]) -> str | None:
    """A call's arguments (None when no piece came, as a completion without them reads)."""
    return "".join(pieces) if pieces else None
