"""Executors for the Agents SDK's ``ShellTool(executor=...)`` and ``LocalShellTool``: the
model's commands run in a shellbox container instead of on the host."""

from __future__ import annotations

from agents.tool import (
    LocalShellCommandRequest,
    ShellCallOutcome,
    ShellCommandOutput,
    ShellCommandRequest,
    ShellResult,
)

from shellbox.integrations.agents.container import ShellboxContainer


class ShellboxShellExecutor:
    """``ShellTool(executor=ShellboxShellExecutor(container))``.

    Each call's commands run in order in the container's ``/mnt/data`` with the call's
    ``timeout_ms`` and ``max_output_length`` (the server clamps both); the result carries every
    command's outcome and the ``max_output_length`` the server applied. Without a container,
    one is created on first use from ``$SHELLBOX_BASE_URL`` / ``$SHELLBOX_API_KEY``.
    """

    def __init__(self, container: ShellboxContainer | None = None) -> None:
        self.container = container or ShellboxContainer()

    async def __call__(self, request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        cid = await self.container.id()
        out = await self.container.client.calls.shell(
            cid,
            action.commands,
            timeout_ms=action.timeout_ms,
            max_output_length=action.max_output_length,
            call_id=request.data.call_id,
        )
        outputs = [
            ShellCommandOutput(
                stdout=o.stdout,
                stderr=o.stderr,
                outcome=ShellCallOutcome(type=o.outcome.type, exit_code=o.outcome.exit_code),
                command=command,
            )
            for o, command in zip(out.output, action.commands, strict=False)
        ]
        return ShellResult(
            output=outputs,
            max_output_length=out.max_output_length,
            # Not shown to the model; lets the application find what the call produced.
            provider_data={
                "container_id": cid,
                "files": [{"file_id": f.file_id, "filename": f.filename} for f in out.files],
            },
        )


class ShellboxLocalShellExecutor:
    """``LocalShellTool(executor=ShellboxLocalShellExecutor(container))``.

    Runs the call's argv with its ``env``, ``working_directory`` and ``timeout_ms`` as the
    sandbox user and returns the text the model reads (stdout, stderr, and a line for a
    failure or timeout), as OpenAI's reference local-shell loop does.
    """

    def __init__(self, container: ShellboxContainer | None = None) -> None:
        self.container = container or ShellboxContainer()

    async def __call__(self, request: LocalShellCommandRequest) -> str:
        action = request.data.action
        cid = await self.container.id()
        out = await self.container.client.calls.local_shell(
            cid,
            action.command,
            env=action.env,
            working_directory=action.working_directory,
            timeout_ms=action.timeout_ms,
            user=action.user,
            call_id=request.data.call_id,
        )
        return out.output
