"""Per-container host uid ranges: claimed uniquely host-wide, kept across restarts of the
owning process, freed on destroy, taken back when their container is gone, never over host
ids; and containers made before ranges existed keep the image's range. Real containers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir, run1

from shellbox.errors import CapacityExceeded, SandboxError
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime, uid_ranges
from shellbox.sandbox.idmap import IMAGE_UID_BASE, RANGE_FILE, UidRanges
from shellbox.settings import Settings


def runtime_on(state: Path, claims: Path | None = None, count: int | None = None) -> OciRuntime:
    runtime: dict[str, object] = {"image_dir": IMAGE_DIR}
    if claims is not None:
        runtime["uid_claims_dir"] = claims
    if count is not None:
        runtime["uid_range_count"] = count
    return create_runtime(Settings(state_dir=state, runtime=runtime))


def claimed(claims: Path) -> list[str]:
    return sorted(p for p in os.listdir(claims) if not p.startswith("."))


async def uid_map_base(rt: OciRuntime, cid: str) -> int:
    r = await run1(rt, cid, "cat /proc/self/uid_map")
    return int(r.stdout.split()[1])


async def test_ranges_are_unique_host_wide_and_kept_across_restarts(
    host_state_dir: Path,
) -> None:
    second_state = make_state_dir()
    first, second = runtime_on(host_state_dir), runtime_on(second_state)
    mine = [new_id("cntr_") for _ in range(3)]
    theirs = [new_id("cntr_") for _ in range(3)]
    try:
        for rt, ids in ((first, mine), (second, theirs)):
            for cid in ids:
                await rt.create(ContainerSpec(id=cid))
        bases = [first.uid_base(c) for c in mine] + [second.uid_base(c) for c in theirs]
        assert len(set(bases)) == 6  # two servers on one host never share a range
        claims = first.uid_ranges.claims_dir
        for rt, ids in ((first, mine), (second, theirs)):
            for cid in ids:
                index = rt.uid_ranges.index(rt.uid_base(cid))
                assert index is not None
                owner = (claims / str(index)).read_text().strip()
                assert owner == str(rt.container_dir(cid))
        cid = mine[0]
        await first.start(cid)
        base = await uid_map_base(first, cid)
        assert base == first.uid_base(cid)
        await run1(first, cid, "echo before > /mnt/data/kept.txt; echo home > ~/kept.txt")
        await first.stop(cid)
        again = runtime_on(host_state_dir)  # the server restarts: the container keeps its range
        assert await again.recover() == {c: "restarted" for c in mine}
        assert await uid_map_base(again, cid) == base
        r = await run1(
            again, cid, "echo after >> /mnt/data/kept.txt && cat /mnt/data/kept.txt ~/kept.txt"
        )
        assert r.stdout == "before\nafter\nhome\n", r.stderr
    finally:
        for rt, ids in ((first, mine), (second, theirs)):
            for cid in ids:
                await rt.destroy(cid)
        remove_state_dir(second_state)


async def test_a_range_is_freed_on_destroy_and_taken_back_when_its_owner_is_gone(
    host_state_dir: Path, tmp_path: Path
) -> None:
    """A pool of two ranges: a third container is refused (429, retry); destroying one
    frees its range; the range of a container whose directory vanished without a destroy
    (a deleted state directory) is taken back once the pool runs out."""
    claims = tmp_path / "claims"
    rt = runtime_on(host_state_dir, claims, count=2)
    a, b, c = (new_id("cntr_") for _ in range(3))
    await rt.create(ContainerSpec(id=a))
    await rt.create(ContainerSpec(id=b))
    with pytest.raises(CapacityExceeded, match=r"already holds 2 containers.*uid_range_count"):
        await rt.create(ContainerSpec(id=c))
    freed = rt.uid_base(a)
    await rt.destroy(a)
    assert claimed(claims) == [str(rt.uid_ranges.index(rt.uid_base(b)))]
    assert not rt.container_dir(c).exists()  # the refused create left nothing
    await rt.create(ContainerSpec(id=c))
    assert rt.uid_base(c) == freed
    await rt.start(c)
    assert await uid_map_base(rt, c) == freed
    await rt.destroy(c)
    # b's state directory disappears without a destroy; its claim stays until needed.
    gone_state = make_state_dir()
    other = runtime_on(gone_state, claims, count=2)
    d = new_id("cntr_")
    await other.create(ContainerSpec(id=d))
    remove_state_dir(gone_state)
    e = new_id("cntr_")
    await rt.create(ContainerSpec(id=e))  # the pool is full: d's range is stale, taken back
    assert len(claimed(claims)) == 2
    for cid in (b, e):
        await rt.destroy(cid)
    assert claimed(claims) == []


async def test_a_container_made_before_ranges_keeps_the_image_range(
    runtime: OciRuntime,
) -> None:
    """Upgrading the server: a container directory without a recorded range is the image's
    range, with files owned by it; it starts and works as before (no id-mapped image)."""
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid))
    cdir = runtime.container_dir(cid)
    base = runtime.uid_base(cid)
    (cdir / RANGE_FILE).unlink()  # as an older server left it
    runtime.uid_ranges.release(base, cdir)
    disk = runtime.disk_dir(cid)
    for path, uid in ((cdir, None), (disk, None), (disk / "upper", 0), (disk / "data", 1000)):
        if uid is None:
            os.chown(path, 0, IMAGE_UID_BASE)
        else:
            os.chown(path, IMAGE_UID_BASE + uid, IMAGE_UID_BASE + uid)
    fresh = create_runtime(Settings(state_dir=runtime.state_dir, runtime={"image_dir": IMAGE_DIR}))
    try:
        assert fresh.uid_base(cid) == IMAGE_UID_BASE
        await fresh.start(cid)
        assert await uid_map_base(fresh, cid) == IMAGE_UID_BASE
        r = await run1(
            fresh, cid, "echo ok > /mnt/data/f && cat /mnt/data/f && ls -ln /usr/bin/env"
        )
        assert r.stdout.startswith("ok\n") and " 0 0 " in r.stdout, (r.stdout, r.stderr)
    finally:
        await fresh.destroy(cid)


def test_the_pool_never_overlaps_host_ids(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "subgid").write_text("")
    pool = UidRanges(first=1 << 30, count=16, claims_dir=tmp_path / "claims")
    (etc / "subuid").write_text(f"alice:{(1 << 30) + 5 * 65536}:65536\n")
    with pytest.raises(SandboxError, match=r"runtime.uid_range_first.*subuid alice"):
        pool.check_host(etc)
    (etc / "subuid").write_text("alice:100000:65536\n")
    pool.check_host(etc)
    (etc / "passwd").write_text(f"svc:x:{(1 << 30) + 7}:0::/:/bin/false\n")
    with pytest.raises(SandboxError, match="passwd svc"):
        pool.check_host(etc)
    with pytest.raises(SandboxError, match="multiple of 65536"):
        UidRanges(first=(1 << 30) + 1, count=1)
    with pytest.raises(SandboxError, match="image"):
        UidRanges(first=65536 * 2, count=4)
    defaults = uid_ranges(Settings())
    assert defaults.span.start >= 1 << 20 and defaults.span.stop <= 0x7FFE_0000
