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
    default_timeout_ms: int = 120_000
    max_timeout_ms: int = 300_000
    default_max_output_length: int = 16_384
    max_output_length: int = 65_536
    max_commands: int = 100

    @classmethod
    def from_settings(cls, s: LimitSettings) -> ShellLimits:
        return cls(
            s.default_timeout_ms,
            s.max_timeout_ms,
            s.default_max_output_length,
            s.max_output_length,
            s.max_commands,
        )

    def timeout_ms(self, requested: int | None) -> int:
        """Null, zero or negative means the default; anything above the clamp is clamped."""
        if requested is None or requested <= 0:
            return min(self.default_timeout_ms, self.max_timeout_ms)
        return min(requested, self.max_timeout_ms)

    def output_length(self, requested: int | None) -> int:
        if requested is None or requested < 0:
            return min(self.default_max_output_length, self.max_output_length)
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
