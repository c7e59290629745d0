"""A model's tool-call arguments, checked: each parser returns the action or operation as the
Responses API item carries it, and an error message for the model when it cannot run.

Models get arguments wrong in a few common ways (a JSON string that does not parse, a single
command where a list belongs, a number sent as a string); what can be read unambiguously is
accepted, the rest is answered with an error the model can react to.
"""

from __future__ import annotations

import json
from typing import Any

SHELL_EXAMPLE = '{"commands": ["ls -la"]}'
PATCH_EXAMPLE = '{"operation": "create_file", "path": "notes.txt", "diff": "+hello\\n"}'
LOCAL_SHELL_EXAMPLE = '{"command": ["bash", "-lc", "ls"]}'


def decode(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Function-call arguments (a JSON string, or an object some servers send as is)."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or raw == "":
        return {}, None
    if not isinstance(raw, str):
        return {}, "the arguments are not a JSON object"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return {}, "the arguments are not a JSON object"
    return value, None


def _int_or_none(value: Any) -> tuple[int | None, bool]:
    if value is None:
        return None, True
    if isinstance(value, bool):
        return None, False
    if isinstance(value, int):
        return value, True
    if isinstance(value, float) and value.is_integer():
        return int(value), True
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value), True
    return None, False


def shell_action(args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    commands = args.get("commands")
    if isinstance(commands, str):
        commands = [commands]
    error = None
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        commands, error = [], "'commands' must be a list of strings"
    elif not commands:
        error = "'commands' is empty"
    action: dict[str, Any] = {"commands": commands}
    for key in ("timeout_ms", "max_output_length"):
        value, ok = _int_or_none(args.get(key))
        action[key] = value
        if not ok and error is None:
            error = f"'{key}' must be an integer"
    if error:
        return action, f"invalid shell call: {error}. Call it like {SHELL_EXAMPLE}."
    return action, None


def patch_operation(args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    kind = args.get("operation", args.get("type"))
    path = args.get("path")
    diff = args.get("diff")
    op: dict[str, Any] = {"type": kind if isinstance(kind, str) else "update_file"}
    op["path"] = path if isinstance(path, str) else ""
    if kind != "delete_file":
        op["diff"] = diff if isinstance(diff, str) else ""
    error = None
    if kind not in ("create_file", "update_file", "delete_file"):
        error = "'operation' must be create_file, update_file or delete_file"
    elif not isinstance(path, str) or not path:
        error = "'path' is required"
    elif kind != "delete_file" and not isinstance(diff, str):
        error = f"'diff' is required for {kind}"
    if error:
        return op, f"invalid apply_patch call: {error}. Call it like {PATCH_EXAMPLE}."
    return op, None


def local_shell_action(args: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    command = args.get("command")
    env = args.get("env") or {}
    timeout, timeout_ok = _int_or_none(args.get("timeout_ms"))
    workdir = args.get("working_directory")
    action: dict[str, Any] = {
        "type": "exec",
        "command": command if isinstance(command, list) else [],
        "env": env if isinstance(env, dict) else {},
        "timeout_ms": timeout,
        "working_directory": workdir if isinstance(workdir, str) else None,
        "user": None,
    }
    error = None
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        error = "'command' must be a non-empty argv list of strings"
    elif not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        error = "'env' must be an object of strings"
    elif not timeout_ok:
        error = "'timeout_ms' must be an integer"
    if error:
        return action, f"invalid local_shell call: {error}. Call it like {LOCAL_SHELL_EXAMPLE}."
    return action, None
