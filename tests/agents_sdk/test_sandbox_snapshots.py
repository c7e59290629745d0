"""The Agents SDK provider persists a workspace as a server-side snapshot reference and
hydrates one by forking it, through the SDK's own stop/resume lifecycle; it falls back to a
tar where the server takes no snapshots, and hydrates a tar as before."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import openai
import pytest
from agents.sandbox import LocalSnapshotSpec, Manifest
from agents.sandbox.entries import File
from agents.sandbox.errors import WorkspaceArchiveWriteError

from shellbox.client import AsyncShellbox, NotFoundError
from shellbox.integrations.agents import ShellboxSandboxClient, ShellboxSandboxClientOptions
from shellbox.integrations.agents.sandbox import SNAPSHOT_REF_MAGIC, decode_snapshot_ref

# A package installed outside the workspace: only a snapshot carries it across.
INSTALL = "mkdir -p ~/.local/lib/pkg && echo 'VALUE = 7' > ~/.local/lib/pkg/__init__.py"


async def _cat(session: Any, *paths: str) -> str:
    out = await session.exec("cat " + " ".join(paths), timeout=30)
    assert out.exit_code == 0, out.stderr
    return str(out.stdout.decode())


async def test_persist_and_resume_through_a_snapshot(sb: AsyncShellbox, tmp_path: Path) -> None:
    client = ShellboxSandboxClient(sb)
    spec = LocalSnapshotSpec(base_path=tmp_path)
    manifest = Manifest(entries={"README.md": File(content=b"from the manifest\n")})
    options = ShellboxSandboxClientOptions(name="snap-session", memory_limit="4g")
    session = await client.create(manifest=manifest, options=options, snapshot=spec)
    await session.start()
    first = session.state.container_id
    await session.exec(f"echo work > notes.txt && {INSTALL}", timeout=30)
    await session.aclose()  # stop() persists, shutdown() deletes the container
    with pytest.raises(openai.NotFoundError):
        await sb.openai.containers.retrieve(first)

    # What the SDK stored is a reference, not the workspace's bytes.
    [stored] = tmp_path.glob("*.tar")
    raw = stored.read_bytes()
    assert raw.startswith(SNAPSHOT_REF_MAGIC) and len(raw) < 200
    ref = decode_snapshot_ref(raw)
    assert ref is not None and ref[1] == sb.base_url
    snap = await sb.snapshots.retrieve(ref[0])
    assert snap.container_id == first and snap.name is not None

    payload = client.serialize_session_state(session.state)
    resumed = await client.resume(client.deserialize_session_state(payload))
    made_by_resume = resumed.state.container_id
    try:
        await resumed.start()  # restores the snapshot: the container is replaced by a fork
        forked = resumed.state.container_id
        assert forked != made_by_resume
        with pytest.raises(openai.NotFoundError):
            await sb.openai.containers.retrieve(made_by_resume)
        container = await sb.openai.containers.retrieve(forked)
        assert (container.name, container.memory_limit) == ("snap-session", "4g")
        text = await _cat(resumed, "notes.txt", "README.md", "~/.local/lib/pkg/__init__.py")
        assert text == "work\nfrom the manifest\nVALUE = 7\n"
        assert (await sb.snapshots.retrieve(snap.id)).last_used_at >= snap.last_used_at
    finally:
        await resumed.aclose()  # persists again: a new snapshot, the previous one deleted
    with pytest.raises(NotFoundError):
        await sb.snapshots.retrieve(snap.id)
    newer = decode_snapshot_ref(stored.read_bytes())
    assert newer is not None and newer[0] != snap.id
    await sb.snapshots.delete(newer[0])


async def test_tar_where_the_server_takes_no_snapshots(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_STORAGE__BACKEND": "none"})
    async with AsyncShellbox(srv.base_url, "k") as api:
        client = ShellboxSandboxClient(api)
        source = await client.create(options=ShellboxSandboxClientOptions())
        target = await client.create(options=ShellboxSandboxClientOptions())
        try:
            await source.start()
            await source.exec("mkdir -p d && echo tarred > d/t.txt", timeout=30)
            archive = await source.persist_workspace()  # 501 snapshots_unavailable: a tar
            raw = archive.read()
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                assert "./d/t.txt" in tar.getnames()
            await target.start()
            before = target.state.container_id
            await target.hydrate_workspace(io.BytesIO(raw))
            assert target.state.container_id == before  # unpacked in place
            assert await _cat(target, "d/t.txt") == "tarred\n"
        finally:
            for s in (source, target):
                await s.aclose()


async def test_tar_on_request_and_a_reference_from_elsewhere(
    sb: AsyncShellbox, server_factory: Any
) -> None:
    client = ShellboxSandboxClient(sb)
    tar_options = ShellboxSandboxClientOptions(workspace_persistence="tar")
    source = await client.create(options=tar_options)
    target = await client.create(options=ShellboxSandboxClientOptions())
    try:
        await source.start()
        await source.exec("echo portable > p.txt", timeout=30)
        raw = (await source.persist_workspace()).read()
        assert not raw.startswith(SNAPSHOT_REF_MAGIC)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            assert "./p.txt" in tar.getnames()
        await target.start()
        before = target.state.container_id
        await target.hydrate_workspace(io.BytesIO(raw))  # a tar into a snapshot-capable one
        assert target.state.container_id == before
        assert await _cat(target, "p.txt") == "portable\n"

        # A reference taken here means nothing to another server: a clear error, and the
        # session keeps its container.
        ref_raw = (await target.persist_workspace()).read()
        ref = decode_snapshot_ref(ref_raw)
        assert ref is not None
        other = server_factory()
        async with AsyncShellbox(other.base_url, "k") as elsewhere:
            far = await ShellboxSandboxClient(elsewhere).create(
                options=ShellboxSandboxClientOptions()
            )
            try:
                await far.start()
                kept = far.state.container_id
                with pytest.raises(WorkspaceArchiveWriteError) as caught:
                    await far.hydrate_workspace(io.BytesIO(ref_raw))
                context = caught.value.context
                assert context["reason"] == "snapshot_not_found"
                assert context["snapshot_id"] == ref[0]
                assert "workspace_persistence='tar'" in str(context["detail"])
                assert far.state.container_id == kept
            finally:
                await far.aclose()
        await sb.snapshots.delete(ref[0])
    finally:
        for s in (source, target):
            await s.aclose()
