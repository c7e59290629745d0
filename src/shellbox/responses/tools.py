"""The tools a request offers the model (``tools``, ``tool_choice``), checked once.

Where a call runs: ``shell`` with a ``container_auto`` or ``container_reference`` environment
is hosted (shellbox runs it and loops); ``shell`` with ``local`` or no environment, and
``function`` tools, go back to the client. ``apply_patch`` and ``local_shell`` calls run in the
request's container when it has one, and go back to the client otherwise.

``openrouter:shell`` (OpenRouter's server tool, ``{"type": "openrouter:shell", "parameters":
{"engine", "environment"}}``) is the same hosted shell under another shape: it sets
``ToolSet.openrouter``, which only changes how its calls are shown (``responses.openrouter``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from shellbox.errors import InvalidRequest

HOSTED_ENVIRONMENTS = ("container_auto", "container_reference")
BUILTIN_NAMES = ("shell", "apply_patch", "local_shell")
OPENROUTER_SHELL = "openrouter:shell"
OPENROUTER_ENGINES = ("openrouter", "auto")
MEMORY_LIMITS = ("1g", "4g", "16g", "64g")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass
class ToolSet:
    shell: bool = False
    # The shell tool's environment as the client gave it; None means local.
    environment: dict[str, Any] | None = None
    local_skills: list[dict[str, str]] = field(default_factory=list)
    apply_patch: bool = False
    local_shell: bool = False
    functions: dict[str, FunctionTool] = field(default_factory=dict)
    # The shell came as ``openrouter:shell``: its calls are shown in OpenRouter's shapes.
    openrouter: bool = False

    @property
    def hosted(self) -> bool:
        return self.environment is not None and self.environment["type"] in HOSTED_ENVIRONMENTS

    def names(self) -> list[str]:
        builtin = [
            n
            for n, on in (
                ("shell", self.shell),
                ("apply_patch", self.apply_patch),
                ("local_shell", self.local_shell),
            )
            if on
        ]
        return [*builtin, *self.functions]

    def __bool__(self) -> bool:
        return bool(self.names())


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None  # with mode "tool": shell, apply_patch, local_shell or a function


AUTO = ToolChoice("auto")
NONE = ToolChoice("none")


def _fail(msg: str, param: str) -> InvalidRequest:
    return InvalidRequest(msg, param=param)


def _str_list(value: Any, param: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        msg = f"{param} must be a list of strings"
        raise _fail(msg, param)
    return list(value)


def _environment(env: Any, param: str) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The checked environment (None for local) and the local skills to describe."""
    if env is None:
        return None, []
    if not isinstance(env, dict):
        msg = f"{param} must be an object with a 'type'"
        raise _fail(msg, param)
    kind = env.get("type")
    if kind == "local":
        skills = env.get("skills") or []
        if not isinstance(skills, list):
            msg = f"{param}.skills must be a list"
            raise _fail(msg, f"{param}.skills")
        for i, s in enumerate(skills):
            ok = isinstance(s, dict) and all(
                isinstance(s.get(k), str) for k in ("name", "description", "path")
            )
            if not ok:
                msg = "a local skill is {name, description, path}, all strings"
                raise _fail(msg, f"{param}.skills[{i}]")
        return None, [{k: s[k] for k in ("name", "description", "path")} for s in skills]
    if kind == "container_reference":
        if not isinstance(env.get("container_id"), str) or not env["container_id"]:
            msg = "container_reference needs a container_id"
            raise _fail(msg, f"{param}.container_id")
        return {"type": kind, "container_id": env["container_id"]}, []
    if kind == "container_auto":
        out: dict[str, Any] = {"type": kind}
        memory = env.get("memory_limit")
        if memory is not None and memory not in MEMORY_LIMITS:
            msg = f"memory_limit must be one of {', '.join(MEMORY_LIMITS)}"
            raise _fail(msg, f"{param}.memory_limit")
        out["memory_limit"] = memory or "1g"
        out["file_ids"] = _str_list(env.get("file_ids"), f"{param}.file_ids")
        policy = env.get("network_policy")
        if policy is not None and not (isinstance(policy, dict) and "type" in policy):
            msg = "network_policy must be an object with a 'type'"
            raise _fail(msg, f"{param}.network_policy")
        out["network_policy"] = policy or {"type": "disabled"}
        skills = env.get("skills") or []
        if not isinstance(skills, list) or not all(isinstance(s, dict) for s in skills):
            msg = "skills must be a list of skill objects"
            raise _fail(msg, f"{param}.skills")
        out["skills"] = skills
        return out, []
    msg = "environment.type must be 'container_auto', 'container_reference' or 'local'"
    raise _fail(msg, f"{param}.type")


def _openrouter_environment(tool: dict[str, Any], param: str) -> dict[str, Any]:
    """The native environment an ``openrouter:shell`` tool asks for. Every parameter is
    optional; ``sleep_after_seconds`` (legacy: containers sleep after 5 idle minutes, as the
    server's settings say) is accepted and ignored."""
    params = tool.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        msg = "parameters must be an object ({engine, environment}, both optional)"
        raise _fail(msg, f"{param}.parameters")
    engine = params.get("engine")
    if engine is not None and engine not in OPENROUTER_ENGINES:
        msg = "parameters.engine must be 'openrouter' or 'auto'"
        raise _fail(msg, f"{param}.parameters.engine")
    env = params.get("environment")
    if env is None:
        return {"type": "container_auto"}
    if isinstance(env, dict) and env.get("type") == "local":
        msg = (
            "openrouter:shell runs commands in a hosted container; 'local' environments are not "
            "supported (use container_auto or container_reference)"
        )
        raise _fail(msg, f"{param}.parameters.environment.type")
    if isinstance(env, dict) and env.get("type") is None:
        env = {**env, "type": "container_auto"}
    return env


def parse_tools(value: Any) -> ToolSet:
    tools = ToolSet()
    if value is None:
        return tools
    if not isinstance(value, list):
        msg = "tools must be a list"
        raise _fail(msg, "tools")
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or not isinstance(kind, str):
            msg = "each tool must be an object with a 'type'"
            raise _fail(msg, param)
        if (
            kind in ("shell", OPENROUTER_SHELL)
            and tools.shell
            and (tools.openrouter or kind == OPENROUTER_SHELL)
        ):
            msg = "list one shell tool: shell and openrouter:shell are the same hosted shell"
            raise _fail(msg, param)
        if kind in BUILTIN_NAMES and kind in tools.names():
            msg = f"the {kind} tool is listed twice"
            raise _fail(msg, param)
        if kind == OPENROUTER_SHELL:
            tools.shell = tools.openrouter = True
            raw = _openrouter_environment(tool, param)
            env, _ = _environment(raw, f"{param}.parameters.environment")
            tools.environment = env
        elif kind == "shell":
            tools.shell = True
            env, skills = _environment(tool.get("environment"), f"{param}.environment")
            tools.environment, tools.local_skills = env, skills
        elif kind == "apply_patch":
            tools.apply_patch = True
        elif kind == "local_shell":
            tools.local_shell = True
        elif kind == "function":
            name = tool.get("name")
            if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
                msg = "a function tool needs a name of 1-64 letters, digits, '_' or '-'"
                raise _fail(msg, f"{param}.name")
            if name in BUILTIN_NAMES or name in tools.functions:
                msg = f"the tool name {name!r} is already taken"
                raise _fail(msg, f"{param}.name")
            params = tool.get("parameters")
            if params is not None and not isinstance(params, dict):
                msg = "parameters must be a JSON Schema object"
                raise _fail(msg, f"{param}.parameters")
            desc = tool.get("description")
            strict = tool.get("strict")
            tools.functions[name] = FunctionTool(
                name,
                desc if isinstance(desc, str) else None,
                params,
                strict if isinstance(strict, bool) else None,
            )
        else:
            msg = (
                f"tool type {kind!r} is not supported here; this server offers shell, "
                "openrouter:shell, apply_patch, local_shell and function tools"
            )
            raise _fail(msg, f"{param}.type")
    return tools


def parse_tool_choice(value: Any, tools: ToolSet) -> ToolChoice:
    if value is None or value == "auto":
        return AUTO
    if value in ("none", "required"):
        return ToolChoice(value)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == OPENROUTER_SHELL and tools.openrouter:
            return ToolChoice("tool", "shell")
        name = value.get("name") if kind == "function" else kind
        if kind in (*BUILTIN_NAMES, "function") and isinstance(name, str):
            if name not in tools.names():
                msg = f"tool_choice names {name!r}, which is not among the request's tools"
                raise _fail(msg, "tool_choice")
            return ToolChoice("tool", name)
    msg = (
        "tool_choice must be 'auto', 'none', 'required', {'type': 'shell'}, "
        "{'type': 'apply_patch'}, {'type': 'local_shell'} or {'type': 'function', 'name': ...}"
    )
    raise _fail(msg, "tool_choice")
