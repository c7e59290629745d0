"""A SandboxAgent on shellbox, driven by the SDK's Runner and its scripted model: it writes
files, the run state is persisted as JSON, and a second run resumes it into a new container
whose workspace was restored from the snapshot."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import RunConfig, Runner
from agents.items import ToolCallOutputItem
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.sandbox.errors import (
    ExecTimeoutError,
    InvalidManifestPathError,
    WorkspaceReadNotFoundError,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import (
    ShellboxSandboxClient,
    ShellboxSandboxClientOptions,
    ShellboxSandboxSessionState,
)

PATCH = """*** Begin Patch
*** Add File: notes/todo.md
+# todo
+- ship it
*** End Patch
"""


def outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


def exec_call(cmd: str, call_id: str) -> Any:
    return function_call("exec_command", {"cmd": cmd, "yield_time_ms": 30_000}, call_id=call_id)


async def test_sandbox_agent_persists_and_resumes_into_a_new_container(
    sb: AsyncShellbox, tmp_path: Path
) -> None:
    client = ShellboxSandboxClient(sb)
    snapshot = LocalSnapshotSpec(base_path=tmp_path / "snapshots")
    model = ScriptedModel(
        [
            [
                exec_call(
                    "pwd && mkdir -p notes && echo hello > notes/a.txt && echo $GREETING", "c1"
                )
            ],
            [
                ResponseCustomToolCall(
                    type="custom_tool_call", name="apply_patch", input=PATCH, call_id="c2", id="c2"
                )
            ],
            [exec_call("printf '\\000\\377' > blob.bin && ls -R", "c3")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(
        name="writer",
        model=model,
        instructions="Write notes.",
        default_manifest=Manifest(
            entries={"README.md": File(content=b"from the manifest\n")},
            environment={"value": {"GREETING": "hi there"}},
        ),
    )
    result = await Runner.run(
        agent,
        "write some notes",
        run_config=RunConfig(
            sandbox=SandboxRunConfig(
                client=client,
                options=ShellboxSandboxClientOptions(name="sandbox-agent-test"),
                snapshot=snapshot,
            ),
        ),
    )
    model.assert_complete()
    first, patched, listing = outputs(result)
    # The workspace is /mnt/data and the manifest's environment reaches the commands.
    assert "/mnt/data" in first and "hi there" in first, first
    # The SDK's apply_patch tool wrote through the session (server-side write endpoint).
    assert patched == "Created notes/todo.md", patched
    assert "README.md" in listing and "a.txt" in listing and "todo.md" in listing, listing

    # The run state is persisted as JSON, as an application would store it.
    saved = json.loads(json.dumps(result.to_state().to_json()))
    payload = saved["sandbox"]["session_state"]
    assert payload["type"] == "shellbox"
    first_container = payload["container_id"]
    # The session shut down: its container is gone (keep_on_exit is off).
    with pytest.raises(openai.NotFoundError):
        await sb.openai.containers.retrieve(first_container)

    state = client.deserialize_session_state(payload)
    assert isinstance(state, ShellboxSandboxSessionState)
    model2 = ScriptedModel(
        [
            [exec_call("cat notes/a.txt notes/todo.md README.md && od -An -tx1 blob.bin", "d1")],
            [assistant_message("restored")],
        ]
    )
    agent2 = SandboxAgent(name="writer", model=model2, instructions="Read notes.")
    result2 = await Runner.run(
        agent2,
        "read the notes",
        run_config=RunConfig(
            sandbox=SandboxRunConfig(client=client, session_state=state, snapshot=snapshot)
        ),
    )
    model2.assert_complete()
    [text] = outputs(result2)
    assert "hello" in text and "- ship it" in text and "from the manifest" in text, text
    assert "00 ff" in text, text
    resumed = result2.to_state().to_json()["sandbox"]["session_state"]["container_id"]
    assert resumed != first_container


async def test_resume_reattaches_to_a_kept_container(sb: AsyncShellbox, tmp_path: Path) -> None:
    client = ShellboxSandboxClient(sb)
    options = ShellboxSandboxClientOptions(name="kept", keep_on_exit=True)
    session = await client.create(options=options, snapshot=LocalSnapshotSpec(base_path=tmp_path))
    await session.start()
    await session.exec("echo kept > k.txt && ln -s /etc/passwd link", timeout=30)
    # PTY methods (test_pty_tools.py drives them through the SDK's tools).
    assert session.supports_pty()
    update = await session.pty_exec_start("cat k.txt", yield_time_s=5)
    assert (update.output, update.exit_code, update.process_id) == (b"kept\n", 0, None)
    with pytest.raises(ExecTimeoutError):
        await session.exec("sleep 5", timeout=0.3)
    # Reads go through the server's path checks: a symlink made in the sandbox that leads out
    # of the workspace is refused with the SDK's error for an escaping path.
    assert (await session.read(Path("k.txt"))).read() == b"kept\n"
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path("missing.txt"))
    with pytest.raises(InvalidManifestPathError):
        await session.read(Path("link"))
    with pytest.raises(InvalidManifestPathError):
        await session.read(Path("../../etc/passwd"))
    await session.aclose()
    await client.delete(session)
    cid = session.state.container_id
    assert (await sb.openai.containers.retrieve(cid)).status in ("running", "sleeping")

    payload = client.serialize_session_state(session.state)
    resumed = await client.resume(client.deserialize_session_state(payload))
    try:
        await resumed.start()
        assert resumed.state.container_id == cid
        out = await resumed.exec("cat k.txt", timeout=30)
        assert out.stdout == b"kept\n"
    finally:
        await sb.openai.containers.delete(cid)


async def test_a_root_under_mnt_data_and_workspace_tar_round_trip(
    sb: AsyncShellbox, tmp_path: Path
) -> None:
    client = ShellboxSandboxClient(sb)
    with pytest.raises(ValueError, match="outside /mnt/data"):
        await client.create(manifest=Manifest(root="/srv/app"))
    manifest = Manifest(root="/mnt/data/proj", entries={"a.txt": File(content=b"A\n")})
    tar = ShellboxSandboxClientOptions(workspace_persistence="tar")
    source = await client.create(manifest=manifest, options=tar)
    target = await client.create(manifest=Manifest(root="/mnt/data/proj"))
    try:
        await source.start()
        await source.write(Path("sub/b.bin"), io.BytesIO(b"\x00B"))
        out = await source.exec("pwd && ls -a && cat a.txt", timeout=30)
        assert out.stdout.decode().split() == ["/mnt/data/proj", ".", "..", "a.txt", "sub", "A"]
        archive = await source.persist_workspace()
        await target.start()
        await target.hydrate_workspace(archive)
        assert (await target.read(Path("/mnt/data/proj/sub/b.bin"))).read() == b"\x00B"
        assert (await target.read(Path("a.txt"))).read() == b"A\n"
    finally:
        for s in (source, target):
            await s.aclose()
