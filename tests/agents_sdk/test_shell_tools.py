"""ShellTool and LocalShellTool runs with shellbox executors, driven by the SDK's Runner and
its scripted model against the real server."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from agents import Agent, LocalShellTool, Runner, ShellTool
from agents.testing import ScriptedModel, assistant_message
from openai.types.responses import ResponseFunctionShellToolCall
from openai.types.responses.response_function_shell_tool_call import Action
from openai.types.responses.response_output_item import LocalShellCall, LocalShellCallAction

from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import (
    ShellboxContainer,
    ShellboxLocalShellExecutor,
    ShellboxShellExecutor,
)


def sent_back(model: ScriptedModel, kind: str) -> dict[str, Any]:
    """The tool output item the runner sent to the model on its second call."""
    call = model.last_call
    assert call is not None
    items = [i for i in call.input if isinstance(i, dict) and i.get("type") == kind]
    assert len(items) == 1, call.input
    return items[0]


async def test_shell_tool_run_creates_a_file_that_is_downloaded(
    sb: AsyncShellbox, client: Any
) -> None:
    box = ShellboxContainer(sb, name="shell-tool")
    commands = [
        "mkdir -p out && echo 'quarterly report' > out/report.txt",
        "cat out/report.txt; echo warning >&2; exit 3",
        "sleep 5",
    ]
    model = ScriptedModel(
        [
            [
                ResponseFunctionShellToolCall(
                    type="shell_call",
                    id="sh_1",
                    call_id="call_sh",
                    status="completed",
                    action=Action(commands=commands, timeout_ms=1500, max_output_length=4000),
                )
            ],
            [assistant_message("the report is in out/report.txt")],
        ]
    )
    agent = Agent(name="shell", model=model, tools=[ShellTool(executor=ShellboxShellExecutor(box))])
    try:
        result = await Runner.run(agent, "write the report")
        model.assert_complete()
        assert result.final_output == "the report is in out/report.txt"
        item = sent_back(model, "shell_call_output")
        assert item["call_id"] == "call_sh"
        assert item["max_output_length"] == 4000  # the limit the server applied
        assert item["output"] == [
            {"stdout": "", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
            {
                "stdout": "quarterly report\n",
                "stderr": "warning\n",
                "outcome": {"type": "exit", "exit_code": 3},
            },
            {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
        ]
        # The file the model's command made is downloadable with the openai SDK.
        cid = box.container_id
        assert cid is not None
        [f] = [f for f in client.containers.files.list(cid) if f.path.endswith("report.txt")]
        assert f.path == "/mnt/data/out/report.txt"
        content = client.containers.files.content.retrieve(f.id, container_id=cid)
        assert content.read() == b"quarterly report\n"
    finally:
        await box.aclose()
    # The container the executor created on first use is deleted with it.
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(cid)


async def test_local_shell_tool_run(sb: AsyncShellbox, client: Any) -> None:
    existing = client.containers.create(name="local-shell")
    box = ShellboxContainer(sb, container_id=existing.id)  # given, not created
    model = ScriptedModel(
        [
            [
                LocalShellCall(
                    type="local_shell_call",
                    id="lsh_1",
                    call_id="call_local",
                    status="completed",
                    action=LocalShellCallAction(
                        type="exec",
                        command=["bash", "-c", 'mkdir -p w && cd w && pwd && echo "$FOO"; exit 4'],
                        env={"FOO": "from the model"},
                        timeout_ms=10_000,
                        working_directory="/mnt/data",
                    ),
                )
            ],
            [assistant_message("ran it")],
        ]
    )
    agent = Agent(
        name="local", model=model, tools=[LocalShellTool(executor=ShellboxLocalShellExecutor(box))]
    )
    try:
        await Runner.run(agent, "run it")
        model.assert_complete()
        item = sent_back(model, "local_shell_call_output")
        assert item["call_id"] == "call_local"
        assert item["output"] == "/mnt/data/w\nfrom the model\nCommand failed with exit code 4.\n"
        await box.aclose()  # a given container is left alone
        assert client.containers.retrieve(existing.id).status == "running"
    finally:
        client.containers.delete(existing.id)
