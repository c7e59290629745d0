"""``POST /v1/responses`` bodies, checked into a ``LoopRequest``.

Fields this server does not implement are refused with a 400 that says so (``background``,
``conversation``, ``prompt``) rather than silently ignored; informational ones (``include``,
``service_tier``, ``prompt_cache_retention``...) are accepted and have no effect.
"""

from __future__ import annotations

from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.responses.items import normalize_input
from shellbox.responses.loop import LoopRequest
from shellbox.responses.tools import parse_tool_choice, parse_tools

UNSUPPORTED = {
    "background": "background responses are not supported by this server",
    "conversation": "conversations are not supported; continue with previous_response_id",
    "prompt": "prompt templates are not supported; send instructions and input",
}
NUMBERS = ("temperature", "top_p")
OBJECTS = ("reasoning", "text")
STRINGS = ("user", "safety_identifier", "prompt_cache_key")


def _fail(msg: str, param: str) -> InvalidRequest:
    return InvalidRequest(msg, param=param)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        msg = f"{key} must be a positive integer"
        raise _fail(msg, key)
    return value


REDACTED = "[redacted]"


def redact_tools(tools: Any) -> Any:
    """The request's tools as a response may echo them: ``domain_secrets`` values never leave
    the server (not in the response, its stream, or the stored copy)."""
    if not isinstance(tools, list):
        return tools
    out = []
    for tool in tools:
        params = tool.get("parameters") if isinstance(tool, dict) else None
        if isinstance(tool, dict) and tool.get("type") == "openrouter:shell":
            if isinstance(params, dict) and isinstance(params.get("environment"), dict):
                [inner] = redact_tools([{"environment": params["environment"]}])
                tool = {**tool, "parameters": {**params, "environment": inner["environment"]}}
            out.append(tool)
            continue
        env = tool.get("environment") if isinstance(tool, dict) else None
        policy = env.get("network_policy") if isinstance(env, dict) else None
        secrets = policy.get("domain_secrets") if isinstance(policy, dict) else None
        if isinstance(env, dict) and isinstance(policy, dict) and isinstance(secrets, list):
            safe = [
                {**s, "value": REDACTED} if isinstance(s, dict) and "value" in s else s
                for s in secrets
            ]
            tool = {
                **tool,
                "environment": {**env, "network_policy": {**policy, "domain_secrets": safe}},
            }
        out.append(tool)
    return out


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key in NUMBERS:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                msg = f"{key} must be a number"
                raise _fail(msg, key)
            params[key] = value
    for key in OBJECTS:
        if body.get(key) is not None:
            if not isinstance(body[key], dict):
                msg = f"{key} must be an object"
                raise _fail(msg, key)
            params[key] = body[key]
    for key in STRINGS:
        if body.get(key) is not None:
            params[key] = str(body[key])
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            msg = "parallel_tool_calls must be a boolean"
            raise _fail(msg, "parallel_tool_calls")
        params["parallel_tool_calls"] = body["parallel_tool_calls"]
    max_tokens = _positive_int(body, "max_output_tokens")
    if max_tokens is not None:
        params["max_output_tokens"] = max_tokens
    return params


def parse_response_request(body: dict[str, Any]) -> tuple[LoopRequest, bool]:
    """The loop request, and whether the client asked for a stream."""
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise _fail(why, key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        msg = "model is required"
        raise _fail(msg, "model")
    input_items = normalize_input(body["input"]) if body.get("input") is not None else []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        msg = "instructions must be a string"
        raise _fail(msg, "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        msg = "previous_response_id must be a response id"
        raise _fail(msg, "previous_response_id")
    for flag in ("store", "stream"):
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            msg = f"{flag} must be a boolean"
            raise _fail(msg, flag)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        msg = "metadata must be an object of strings"
        raise _fail(msg, "metadata")
    tools = parse_tools(body.get("tools"))
    request = LoopRequest(
        model=model,
        input_items=input_items,
        instructions=instructions or None,
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        previous_response_id=previous,
        store=body.get("store") is not False,
        max_tool_calls=_positive_int(body, "max_tool_calls"),
        params=sampling_params(body),
        echo={
            "tools": redact_tools(body.get("tools") or []),
            "tool_choice": body.get("tool_choice") or "auto",
            "metadata": metadata or {},
        },
    )
    return request, bool(body.get("stream"))
