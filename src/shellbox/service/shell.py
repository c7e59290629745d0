"""The semantics of one shell call: validating and clamping its limits, and the output item."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shellbox.agent.protocol import MAX_COMMAND_BYTES
from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.sandbox.base import CommandResult, ExecRequest
from shellbox.settings import LimitSettings


@dataclass(frozen=True)
class ShellLimits:
    """The one place a call's ``timeout_ms`` and ``max_output_length`` get their defaults and
    their clamps (the numbers are ``limits.*`` settings, whose defaults are the agent
    protocol's). Build it with ``from_settings``."""

    default_timeout_ms: int
    max_timeout_ms: int
    default_max_output_length: int
    max_output_length: int
    max_commands: int

    @classmethod
    def from_settings(cls, s: LimitSettings | None = None) -> ShellLimits:
        s = s or LimitSettings()
        return cls(
            # A default above its clamp (a configuration can say so) is clamped too.
            min(s.default_timeout_ms, s.max_timeout_ms),
            s.max_timeout_ms,
            min(s.default_max_output_length, s.max_output_length),
            s.max_output_length,
            s.max_commands,
        )

    def timeout_ms(self, requested: int | None, *, at_most: int | None = None) -> int:
        """Null, zero or negative means the default; anything above the clamp (or above
        ``at_most``, a budget the caller has left) is clamped."""
        wanted = self.default_timeout_ms if requested is None or requested <= 0 else requested
        return min(wanted, self.max_timeout_ms, *(() if at_most is None else (at_most,)))

    def output_length(self, requested: int | None) -> int:
        """Null or negative means the default; anything above the clamp is clamped."""
        if requested is None or requested < 0:
            return self.default_max_output_length
        return min(requested, self.max_output_length)

    def exec_request(
        self,
        commands: Sequence[str],
        timeout_ms: int | None,
        max_output_length: int | None,
        *,
        param: str = "action.commands",
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecRequest:
        check_commands(commands, self.max_commands, param=param)
        return ExecRequest(
            commands=list(commands),
            timeout_ms=self.timeout_ms(timeout_ms),
            max_output_length=self.output_length(max_output_length),
            env=env,
            cwd=cwd,
        )


def int_or_null(value: object, *, param: str) -> int | None:
    """A call's ``timeout_ms`` or ``max_output_length`` as given: an integer or null."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        msg = f"{param} must be an integer or null"
        raise InvalidRequest(msg, param=param)
    return value


def check_commands(commands: Sequence[str], max_commands: int, *, param: str) -> None:
    if not isinstance(commands, list | tuple) or not all(isinstance(c, str) for c in commands):
        msg = "commands must be a list of strings"
        raise InvalidRequest(msg, param=param)
    if not commands:
        msg = "commands is empty: give at least one command to run"
        raise InvalidRequest(msg, param=param)
    if len(commands) > max_commands:
        msg = f"{len(commands)} commands in one call; at most {max_commands} are allowed"
        raise InvalidRequest(msg, param=param)
    for i, c in enumerate(commands):
        if len(c.encode()) > MAX_COMMAND_BYTES:
            msg = f"command {i} is {len(c.encode())} bytes; a command may be at most 1 MiB"
            raise InvalidRequest(msg, param=f"{param}[{i}]")


def shell_call_output_item(
    call_id: str,
    results: Sequence[CommandResult],
    max_output_length: int,
    *,
    item_id: str | None = None,
    status: str = "completed",
) -> dict[str, Any]:
    return {
        "type": "shell_call_output",
        "id": item_id or new_id("sho_"),
        "call_id": call_id,
        "status": status,
        "max_output_length": max_output_length,
        "output": [r.to_wire() for r in results],
    }
