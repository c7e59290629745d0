"""An ApplyPatchTool run with ShellboxEditor: the model's V4A operations are applied in the
container by the server's apply_patch_call endpoint."""

from __future__ import annotations

from typing import Any

from agents import Agent, ApplyPatchTool, Runner
from agents.testing import ScriptedModel, assistant_message

from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import ShellboxContainer, ShellboxEditor


def patch_call(call_id: str, operation: dict[str, Any]) -> dict[str, Any]:
    return {"type": "apply_patch_call", "call_id": call_id, "operation": operation}


def outputs(model: ScriptedModel) -> dict[str, dict[str, Any]]:
    """Every apply_patch_call_output the runner sent back, by call id."""
    out: dict[str, dict[str, Any]] = {}
    for call in model.calls:
        for item in call.input if isinstance(call.input, list) else []:
            if isinstance(item, dict) and item.get("type") == "apply_patch_call_output":
                out[item["call_id"]] = item
    return out


async def test_apply_patch_tool_creates_and_updates_a_file(sb: AsyncShellbox, client: Any) -> None:
    box = ShellboxContainer(sb, name="apply-patch")
    model = ScriptedModel(
        [
            [
                patch_call(
                    "p1",
                    {
                        "type": "create_file",
                        "path": "src/app.py",
                        "diff": "+def greet():\n+    return 'hello'\n+",
                    },
                )
            ],
            [
                patch_call(
                    "p2",
                    {
                        "type": "update_file",
                        "path": "src/app.py",
                        "diff": (
                            "@@ def greet():\n-    return 'hello'\n+    return 'hello, world'\n"
                        ),
                    },
                )
            ],
            [
                patch_call(
                    "p3",
                    {
                        "type": "update_file",
                        "path": "src/app.py",
                        "diff": "@@\n-    return 'no such line'\n+    return 'x'\n",
                    },
                )
            ],
            [assistant_message("patched")],
        ]
    )
    agent = Agent(name="editor", model=model, tools=[ApplyPatchTool(editor=ShellboxEditor(box))])
    try:
        result = await Runner.run(agent, "write the app")
        model.assert_complete()
        assert result.final_output == "patched"
        sent = outputs(model)
        assert sent["p1"] == {
            "type": "apply_patch_call_output",
            "call_id": "p1",
            "status": "completed",
            "output": "Created src/app.py",
        }
        assert sent["p2"]["status"] == "completed", sent["p2"]
        assert sent["p2"]["output"] == "Updated src/app.py"
        # A diff whose context is not in the file fails as the SDK expects: a failed output
        # whose text tells the model why, and the file is left as it was.
        assert sent["p3"]["status"] == "failed", sent["p3"]
        assert "Invalid Context" in sent["p3"]["output"], sent["p3"]
        cid = box.container_id
        assert cid is not None
        out = await sb.calls.shell(cid, ["cat src/app.py", "stat -c %u src/app.py"])
        assert out.output[0].stdout == "def greet():\n    return 'hello, world'\n"
        assert out.output[1].stdout == "1000\n"  # owned by the sandbox user
    finally:
        await box.aclose()
