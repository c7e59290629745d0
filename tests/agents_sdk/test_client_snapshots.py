"""shellbox.client's snapshots, forks, pause and resume against the real server (sync and
async): typed objects back, the server's errors as the client's exception classes."""

from __future__ import annotations

import pytest

from shellbox.client import AsyncShellbox, Container, NotFoundError, Shellbox, Snapshot


def test_snapshot_fork_pause_and_resume(sb_sync: Shellbox) -> None:
    origin = sb_sync.openai.containers.create(name="snap-origin").id
    forks: list[str] = []
    try:
        sb_sync.workspace.write(origin, "notes.txt", b"prepared\n")
        snap = sb_sync.snapshots.create(origin, name="prepared")
        assert isinstance(snap, Snapshot)
        assert (snap.container_id, snap.name, snap.status) == (origin, "prepared", "ready")
        assert snap.id.startswith("snap_") and snap.bytes > 0
        assert snap.expires_at is not None and snap.expires_at > snap.last_used_at
        assert sb_sync.snapshots.retrieve(snap.id) == snap
        assert snap.id in [s.id for s in sb_sync.snapshots.list_all(limit=1)]
        page = sb_sync.snapshots.list(limit=1, order="desc")
        assert len(page.data) == 1 and isinstance(page.data[0], Snapshot)

        fork = sb_sync.snapshots.fork(
            snap.id, name="try-2", memory_limit="4g", expires_after_minutes=30
        )
        forks.append(fork.id)
        assert isinstance(fork, Container) and fork.id != origin
        assert (fork.name, fork.status, fork.memory_limit) == ("try-2", "running", "4g")
        assert fork.expires_after_minutes == 30
        assert sb_sync.workspace.read(fork.id, "notes.txt") == b"prepared\n"
        assert sb_sync.snapshots.retrieve(snap.id).last_used_at >= snap.last_used_at

        sb_sync.calls.shell(fork.id, ["(echo 1 > /tmp/n; sleep 1000) &"])
        paused = sb_sync.containers.pause(fork.id)
        assert (paused.id, paused.status) == (fork.id, "paused")
        assert sb_sync.containers.resume(fork.id).status == "running"
        assert sb_sync.calls.shell(fork.id, ["cat /tmp/n"]).output[0].stdout == "1\n"

        sb_sync.snapshots.delete(snap.id)
        with pytest.raises(NotFoundError) as caught:
            sb_sync.snapshots.retrieve(snap.id)
        assert caught.value.code == "snapshot_not_found"
        with pytest.raises(NotFoundError) as caught:
            sb_sync.snapshots.fork(snap.id)
        assert caught.value.param == "snapshot_id"
        assert sb_sync.workspace.read(fork.id, "notes.txt") == b"prepared\n"
    finally:
        for cid in (origin, *forks):
            sb_sync.openai.containers.delete(cid)


async def test_async_snapshot_fork_pause_and_resume(sb: AsyncShellbox) -> None:
    origin = (await sb.openai.containers.create(name="snap-origin-async")).id
    forks: list[str] = []
    try:
        await sb.workspace.write(origin, "a.txt", b"async\n")
        snap = await sb.snapshots.create(origin)
        assert snap.name is None and snap.container_id == origin
        assert await sb.snapshots.retrieve(snap.id) == snap
        listed = [s.id async for s in sb.snapshots.list_all(limit=1)]
        assert snap.id in listed
        assert (await sb.snapshots.list(limit=100)).data[-1].id in listed
        fork = await sb.snapshots.fork(snap.id, name="async-fork")
        forks.append(fork.id)
        assert await sb.workspace.read(fork.id, "a.txt") == b"async\n"
        assert (await sb.containers.pause(fork.id)).status == "paused"
        assert (await sb.containers.resume(fork.id)).status == "running"
        await sb.snapshots.delete(snap.id)
        with pytest.raises(NotFoundError):
            await sb.snapshots.delete(snap.id)
        with pytest.raises(NotFoundError) as caught:
            await sb.containers.pause("cntr_nope")
        assert caught.value.code == "container_not_found"
    finally:
        for cid in (origin, *forks):
            await sb.openai.containers.delete(cid)
