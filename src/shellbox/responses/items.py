"""Conversation items: checking what a client sends as ``input``, and building our own.

The conversation is kept as Responses API items whatever the upstream speaks; each dialect
translates it on the way out. Input is read leniently where clients are known to differ
(``openai-wire-spec.md`` section 7): replayed items keep their ids and lose ``created_by``,
``shell_call_output`` comes without ``status``, ``local_shell_call_output`` links to its call
by ``call_id`` or ``id``.
"""

from __future__ import annotations

from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.responses import openrouter

# call item type -> the output item type that answers it
CALL_TYPES = {
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "local_shell_call": "local_shell_call_output",
    "function_call": "function_call_output",
}
OUTPUT_TYPES = {v: k for k, v in CALL_TYPES.items()}
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
PARTS = (*TEXT_PARTS, "input_image", "input_file")
OUTPUT_ONLY = ("created_by", "files")


def _fail(msg: str, param: str) -> InvalidRequest:
    return InvalidRequest(msg, param=param)


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant_message(text: str, *, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg_"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts)


def _message(raw: dict[str, Any], param: str) -> dict[str, Any]:
    role = raw.get("role")
    if role not in ROLES:
        msg = f"a message's role must be one of {', '.join(ROLES)}"
        raise _fail(msg, f"{param}.role")
    content = raw.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in PARTS:
                msg = f"content parts may be {', '.join(PARTS)}"
                raise _fail(msg, f"{param}.content[{j}]")
    elif not isinstance(content, str):
        msg = "a message's content must be a string or a list of parts"
        raise _fail(msg, f"{param}.content")
    out = {"type": "message", "role": role, "content": content}
    if role == "assistant" and isinstance(raw.get("phase"), str):
        out["phase"] = raw["phase"]
    return out


def _call_id(raw: dict[str, Any], param: str, *, or_id: bool = False) -> str:
    call_id = raw.get("call_id") or (raw.get("id") if or_id else None)
    if not isinstance(call_id, str) or not call_id:
        msg = "call_id is required"
        raise _fail(msg, f"{param}.call_id")
    return call_id


def _call(raw: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k not in OUTPUT_ONLY}
    out["type"] = kind
    out["call_id"] = _call_id(raw, param)
    out.setdefault("status", "completed")
    if kind == "shell_call":
        action = raw.get("action")
        commands = action.get("commands") if isinstance(action, dict) else None
        if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
            msg = "a shell_call needs action.commands, a list of strings"
            raise _fail(msg, f"{param}.action.commands")
    elif kind == "local_shell_call":
        action = raw.get("action")
        if not isinstance(action, dict) or not isinstance(action.get("command"), list):
            msg = "a local_shell_call needs action.command, an argv list"
            raise _fail(msg, f"{param}.action.command")
    elif kind == "apply_patch_call":
        if not isinstance(raw.get("operation"), dict) and not isinstance(
            raw.get("operations"), list
        ):
            msg = "an apply_patch_call needs an operation"
            raise _fail(msg, f"{param}.operation")
    elif kind == "function_call" and not (
        isinstance(raw.get("name"), str) and isinstance(raw.get("arguments"), str)
    ):
        msg = "a function_call needs a name and arguments (a JSON string)"
        raise _fail(msg, param)
    return out


def _output(raw: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k not in OUTPUT_ONLY}
    out["type"] = kind
    out["call_id"] = _call_id(raw, param, or_id=kind == "local_shell_call_output")
    if kind == "shell_call_output":
        entries = raw.get("output")
        if not isinstance(entries, list):
            msg = "a shell_call_output needs output, a list of {stdout, stderr, outcome}"
            raise _fail(msg, f"{param}.output")
        clean = []
        for j, e in enumerate(entries):
            if not isinstance(e, dict) or not isinstance(e.get("outcome"), dict):
                msg = "each output entry is {stdout, stderr, outcome}"
                raise _fail(msg, f"{param}.output[{j}]")
            clean.append(
                {
                    "stdout": str(e.get("stdout") or ""),
                    "stderr": str(e.get("stderr") or ""),
                    "outcome": e["outcome"],
                }
            )
        out["output"] = clean
    elif kind == "function_call_output":
        if not isinstance(raw.get("output"), str | list):
            msg = "a function_call_output needs output, a string or a list of parts"
            raise _fail(msg, f"{param}.output")
    elif kind == "local_shell_call_output":
        if not isinstance(raw.get("output"), str):
            msg = "a local_shell_call_output needs output, a string"
            raise _fail(msg, f"{param}.output")
    elif kind == "apply_patch_call_output" and raw.get("status") not in ("completed", "failed"):
        msg = "an apply_patch_call_output needs status 'completed' or 'failed'"
        raise _fail(msg, f"{param}.status")
    return out


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of checked items."""
    if isinstance(value, str):
        return [user_message(value)]
    if not isinstance(value, list):
        msg = "input must be a string or a list of items"
        raise _fail(msg, "input")
    items = []
    for i, raw in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(raw, dict):
            msg = "each input item must be an object"
            raise _fail(msg, param)
        kind = raw.get("type") or ("message" if "role" in raw else None)
        if not isinstance(kind, str):
            msg = "each input item needs a type (or a role, for a message)"
            raise _fail(msg, f"{param}.type")
        if kind == "message":
            items.append(_message(raw, param))
        elif kind in CALL_TYPES:
            items.append(_call(raw, kind, param))
        elif kind == openrouter.ITEM_TYPE:
            call, *out = openrouter.expand_input(raw)
            items.append(_call(call, "shell_call", param))
            items.extend(_output(o, "shell_call_output", param) for o in out)
        elif kind in OUTPUT_TYPES:
            items.append(_output(raw, kind, param))
        elif kind == "reasoning":
            items.append({k: v for k, v in raw.items() if k not in OUTPUT_ONLY})
        elif kind == "item_reference":
            msg = "item_reference is not supported; continue with previous_response_id instead"
            raise _fail(msg, f"{param}.type")
        else:
            msg = f"input item type {kind!r} is not supported"
            raise _fail(msg, f"{param}.type")
    return items


def check_pairing(items: list[dict[str, Any]]) -> None:
    """Every tool call must be answered by its output before the model is asked again (the
    upstream APIs reject a conversation with a dangling call), and every output answers one."""
    open_calls: dict[str, str] = {}
    for item in items:
        kind = item.get("type")
        if kind in CALL_TYPES:
            open_calls[item["call_id"]] = kind
        elif kind in OUTPUT_TYPES and open_calls.pop(item["call_id"], None) is None:
            msg = (
                f"No tool call found for {kind} with call_id '{item['call_id']}': it must "
                "follow its call in input (or in the previous response)"
            )
            raise _fail(msg, "input")
    if open_calls:
        call_id, kind = next(iter(open_calls.items()))
        msg = (
            f"No tool output found for {kind} '{call_id}': send a {CALL_TYPES[kind]} item with "
            f"call_id '{call_id}' in input"
        )
        raise _fail(msg, "input")
