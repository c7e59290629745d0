"""A SandboxAgent drives an interactive ``python3`` on shellbox through the SDK's own shell
tools (``exec_command`` with a tty, then ``write_stdin``), which the provider answers with
its PTY methods over the container's terminal route. The model is the SDK's ScriptedModel;
each step reads the session id the previous tool output announced, as a model would."""

from __future__ import annotations

import re
from typing import Any

from agents import RunConfig, Runner
from agents.items import ToolCallOutputItem
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import ShellboxSandboxClient, ShellboxSandboxClientOptions

SESSION = re.compile(r"Process running with session ID (\d+)")


def outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


def last_tool_output(call: ModelCall) -> str:
    items = call.input if isinstance(call.input, list) else []
    found = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    return str(found[-1]["output"])


def write_stdin(chars: str, call_id: str) -> ModelStep:
    """A step that writes to the session the last tool output named."""

    def respond(call: ModelCall) -> Any:
        match = SESSION.search(last_tool_output(call))
        assert match, last_tool_output(call)
        args = {"session_id": int(match.group(1)), "chars": chars, "yield_time_ms": 3000}
        return [function_call("write_stdin", args, call_id=call_id)]

    return ModelStep.respond(respond)


async def test_the_sdk_drives_an_interactive_python_through_the_pty_tools(
    sb: AsyncShellbox,
) -> None:
    client = ShellboxSandboxClient(sb)
    start = {"cmd": "python3 -q", "tty": True, "yield_time_ms": 3000}
    model = ScriptedModel(
        [
            [function_call("exec_command", start, call_id="p1")],
            write_stdin("x = 6 * 7\n", "p2"),
            write_stdin("print(x, __import__('os').getcwd())\n", "p3"),
            write_stdin("raise SystemExit(4)\n", "p4"),
            [function_call("exec_command", {"cmd": "echo plain; exit 2"}, call_id="p5")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(name="repl", model=model, instructions="Use python.")
    result = await Runner.run(
        agent,
        "compute",
        run_config=RunConfig(
            sandbox=SandboxRunConfig(
                client=client, options=ShellboxSandboxClientOptions(name="pty-agent-test")
            )
        ),
    )
    model.assert_complete()
    started, assigned, printed, ended, plain = outputs(result)
    assert ">>> " in started and SESSION.search(started), started
    assert SESSION.search(assigned), assigned
    # The interpreter kept its state between writes, and runs in the workspace.
    assert "42 /mnt/data" in printed and SESSION.search(printed), printed
    assert "Process exited with code 4" in ended, ended
    # Without a tty: no echo, no carriage returns, the exit code.
    assert "Process exited with code 2" in plain and "plain\n" in plain, plain
    assert "\r" not in plain.split("Output:", 1)[-1], plain
