"""The per-container disk quota: the overlay's upper layer (``/home/user`` and every other
rootfs path) and ``/mnt/data`` count against one limit the kernel enforces; past it writes
fail inside and on the host's side of the container, while other containers and the host
write on; after ``rm`` the container writes again, after a restart too. Small quotas keep it
fast. Each test runs under both quota kinds: "auto" (simple quotas on 6.7+, regular qgroups
before: the cgroup v2 guest's 6.1 exercises the fallback) and regular qgroups asked for."""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir, run1

from shellbox.errors import SandboxError
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.sandbox.idmap import IMAGE_UID_BASE
from shellbox.sandbox.oci import BTRFS_SUBVOLUME_IOCTLS, SANDBOX_UID
from shellbox.sandbox.storage import QuotaMode, StorageConfig, open_storage
from shellbox.settings import Settings

MiB = 1 << 20
QUOTA = 64 * MiB
FULL = "Disk quota exceeded"
KERNEL = tuple(int(n) for n in os.uname().release.split(".")[:2])
AUTO: QuotaMode = "simple" if KERNEL >= (6, 7) else "qgroup"


@pytest.fixture(scope="module", params=["auto", "qgroup"])
def quota_state(request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    path = make_state_dir("shellbox-quota-")
    yield path, request.param
    remove_state_dir(path)


@pytest.fixture(scope="module")
async def rt(quota_state: tuple[Path, str]) -> AsyncIterator[OciRuntime]:
    path, mode = quota_state
    settings = Settings(
        state_dir=path, runtime={"image_dir": IMAGE_DIR}, storage={"quota_mode": mode}
    )
    runtime = create_runtime(settings)
    assert runtime.storage.quota_mode == (AUTO if mode == "auto" else mode)
    yield runtime
    for info in await runtime.list():
        await runtime.destroy(info.id)


async def started(rt: OciRuntime, disk_limit_bytes: int = QUOTA) -> str:
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid, disk_limit_bytes=disk_limit_bytes))
    await rt.start(cid)
    return cid


def host_write(path: Path, size: int) -> int:
    """Write ``size`` bytes from the host; returns 0 or the errno it failed with."""
    try:
        with open(path, "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.errno or -1
    return 0


async def test_upper_layer_and_data_share_one_quota_others_write_on(rt: OciRuntime) -> None:
    cid, other = await started(rt), await started(rt, 10 << 30)
    try:
        assert (await run1(rt, cid, "fallocate -l 30M /mnt/data/a")).outcome.exit_code == 0
        assert (await run1(rt, cid, "fallocate -l 20M /home/user/b")).outcome.exit_code == 0
        # A third rootfs path, written the ordinary way: the quota stops it part-way.
        dd = await run1(rt, cid, "dd if=/dev/zero of=/var/tmp/c bs=1M count=30 conv=fsync")
        assert dd.outcome.exit_code != 0 and FULL in dd.stderr, dd
        more = await run1(rt, cid, "fallocate -l 20M /home/user/d")
        assert more.outcome.exit_code != 0 and FULL in more.stderr, more
        # The host's side of the container (uploads, patches) is held to it too ...
        assert host_write(rt.data_dir(cid) / "upload.bin", 20 * MiB) == errno.EDQUOT
        used = rt.disk_usage(cid)
        assert used is not None and 50 * MiB <= used <= QUOTA
        # ... while another container and the host are unaffected.
        big = await run1(rt, other, "fallocate -l 200M /mnt/data/x && fallocate -l 100M ~/y")
        assert big.outcome.exit_code == 0, big
        assert host_write(rt.data_dir(other) / "upload.bin", 20 * MiB) == 0
        assert host_write(rt.state_dir / "host-file", 20 * MiB) == 0
        (rt.state_dir / "host-file").unlink()

        # Removing files gives the space back at once.
        rm = await run1(rt, cid, "rm /mnt/data/a /var/tmp/c && fallocate -l 35M /mnt/data/e")
        assert rm.outcome.exit_code == 0, rm
        ok = await run1(rt, cid, "dd if=/dev/zero of=/home/user/f bs=1M count=5 conv=fsync")
        assert ok.outcome.exit_code == 0, ok
    finally:
        await rt.destroy(cid)
        await rt.destroy(other)


# Each btrfs ioctl that makes a subvolume or snapshot, with and without high bits set (the
# kernel reads the request as 32 bits), then two that must still work: BTRFS_IOC_INO_LOOKUP
# of the directory's own subvolume (unprivileged) and FIONREAD on a pipe.
SUBVOLUME_PROBE = """
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/mnt/data", os.O_RDONLY)
def ioctl(request, buf):
    r = libc.syscall(16, fd, ctypes.c_ulong(request), buf)
    return os.strerror(ctypes.get_errno()) if r < 0 else "ok"
for name, request in sorted(REQUESTS.items(), key=lambda item: "SNAP" in item[0]):
    # A snapshot's source: a subvolume made first (if one could be), else the directory.
    made = "/mnt/data/BTRFS_IOC_SUBVOL_CREATE0"
    src = os.open(made if os.path.exists(made) else "/mnt/data", os.O_RDONLY)
    for high in (0, 0xFFFFFFFF << 32):
        v2 = name.endswith("V2")
        head = struct.pack("qQQ4Q", src, 0, 0, 0, 0, 0, 0) if v2 else struct.pack("q", src)
        args = head + f"{name}{high}".encode().ljust(4096 - len(head), b"\\0")
        print(name, hex(high), ioctl(request | high, ctypes.create_string_buffer(args, 4096)))
lookup = ctypes.create_string_buffer(struct.pack("QQ", 0, 256), 4096)
print("INO_LOOKUP", ioctl(0xD0009412, lookup), struct.unpack_from("Q", lookup.raw)[0] > 0)
r, w = os.pipe(); os.write(w, b"abc"); n = ctypes.c_int()
print("FIONREAD", libc.ioctl(r, 0x541B, ctypes.byref(n)), n.value)
print(sorted(os.listdir("/mnt/data")))
"""


async def test_no_subvolume_nor_snapshot_can_be_made_inside(rt: OciRuntime) -> None:
    # Anyone may make one where they can write, and under regular qgroups its own qgroup would
    # hold any amount outside the container's quota: the seccomp filter refuses all four ways.
    cid = await started(rt)
    probe = SUBVOLUME_PROBE.replace("REQUESTS", repr(BTRFS_SUBVOLUME_IOCTLS))
    try:
        r = await run1(rt, cid, f"python3 -c {shlex.quote(probe)}")
        assert r.stderr == "", r
        lines = r.stdout.splitlines()
        names = sorted(BTRFS_SUBVOLUME_IOCTLS, key=lambda name: "SNAP" in name)
        refused = [f"{n} {hex(h)} Operation not permitted" for n in names
                   for h in (0, 0xFFFFFFFF << 32)]  # fmt: skip
        assert lines == [*refused, "INO_LOOKUP ok True", "FIONREAD 0 3", "[]"], r.stdout
    finally:
        await rt.destroy(cid)
    assert not rt.storage.path(cid).exists()


async def test_a_full_container_restarts_and_recovers(rt: OciRuntime) -> None:
    cid = await started(rt)
    try:
        fill = await run1(rt, cid, "dd if=/dev/zero of=big bs=1M count=100")
        assert FULL in fill.stderr, fill
        await rt.stop(cid)
        await rt.start(cid)  # its spec, config and log live outside the quota
        again = await run1(rt, cid, "rm big && fallocate -l 40M /mnt/data/big && echo ok")
        assert again.stdout == "ok\n", again
    finally:
        await rt.destroy(cid)


async def test_a_new_limit_applies_to_a_created_container(rt: OciRuntime) -> None:
    # What the warm pool does when a request asks for another disk limit than it holds.
    cid = await started(rt)
    try:
        before = await run1(rt, cid, "fallocate -l 100M /mnt/data/x")
        assert FULL in before.stderr, before
        await rt.update(ContainerSpec(id=cid, disk_limit_bytes=256 * MiB))
        assert rt.load_spec(cid).disk_limit_bytes == 256 * MiB
        after = await run1(rt, cid, "fallocate -l 100M /mnt/data/x")
        assert after.outcome.exit_code == 0, after
    finally:
        await rt.destroy(cid)


async def test_destroy_removes_the_disk_and_its_qgroup(rt: OciRuntime) -> None:
    cid = await started(rt)
    await run1(rt, cid, "fallocate -l 10M /mnt/data/x")
    qgroup = rt.storage.qgroup(cid)
    assert qgroup is not None and int((qgroup / "max_referenced").read_text()) == QUOTA
    assert qgroup.name.startswith("1_" if rt.storage.quota_mode == "simple" else "0_")
    assert (rt.disk_usage(cid) or 0) >= 10 * MiB
    await rt.destroy(cid)
    assert not rt.storage.path(cid).exists()
    if rt.storage.quota_mode == "qgroup":  # 0/<id> can go once the cleaner has dropped it
        for wait in ("filesystem", "subvolume", "filesystem"):  # commit, clean, count
            done = subprocess.run(["btrfs", wait, "sync", str(rt.storage.root)], check=False)
            assert done.returncode == 0
        for _ in range(50):  # 6.10+ removes it itself; before, the next removal sweeps it
            rt.storage.clear_stale_qgroups()
            if not qgroup.exists():
                break
            time.sleep(0.1)
    assert not qgroup.exists()
    assert rt.disk_usage(cid) is None


async def test_containers_made_before_disks_run_on_without_a_quota(rt: OciRuntime) -> None:
    # What create() laid out before: upper/, work/ and data/ in the container directory, owned
    # by the image's uid range (there were no ranges per container either).
    cid = new_id("cntr_")
    cdir = rt.container_dir(cid)
    for sub in ("upper", "work", "rootfs", "data"):
        (cdir / sub).mkdir(parents=True)
    cdir.chmod(0o711)
    os.chown(cdir / "upper", IMAGE_UID_BASE, IMAGE_UID_BASE)
    (cdir / "data" / "old.txt").write_text("kept\n")
    for path in (cdir / "data", cdir / "data" / "old.txt"):
        os.chown(path, IMAGE_UID_BASE + SANDBOX_UID, IMAGE_UID_BASE + SANDBOX_UID)
    (cdir / "spec.json").write_text(json.dumps({"id": cid}))
    try:
        assert await rt.recover() == {cid: "restarted"}
        r = await run1(rt, cid, "cat old.txt && fallocate -l 100M /mnt/data/x && echo written")
        assert r.stdout == "kept\nwritten\n", r
        assert rt.data_dir(cid) == cdir / "data"
        assert rt.disk_usage(cid) is None
    finally:
        await rt.destroy(cid)
    assert not cdir.exists()


async def test_metadata_counts_small_files_and_xattrs(rt: OciRuntime) -> None:
    # Inline file data and extended attributes live in btrfs's metadata, not in data extents.
    many = (
        'python3 -c "import os\n'
        "for i in range(20000):\n"
        "    open(f'f{i}', 'w').write('x' * 2000)\n"
        "    os.setxattr(f'f{i}', 'user.pad', b'y' * 2000)\""
    )
    cid = await started(rt, 8 * MiB)
    try:
        r = await run1(rt, cid, many, timeout_ms=60_000)
        assert FULL in r.stderr, r
        assert (rt.disk_usage(cid) or 0) <= 8 * MiB
    finally:
        await rt.destroy(cid)


def test_a_state_directory_keeps_its_backend_and_quota_mode(rt: OciRuntime) -> None:
    with pytest.raises(SandboxError, match='must stay "btrfs"'):
        open_storage(rt.state_dir, StorageConfig(backend="none"))
    mode = rt.storage.quota_mode
    other: QuotaMode = "qgroup" if mode == "simple" else "simple"
    with pytest.raises(SandboxError, match=f'has {mode} quotas.*"auto" or "{mode}"'):
        open_storage(rt.state_dir, StorageConfig(quota_mode=other))
    assert open_storage(rt.state_dir, StorageConfig()).quota_mode == mode  # auto keeps it
    plain = make_state_dir("shellbox-plain-")
    try:
        (open_storage(plain, StorageConfig(backend="none")).root / "cntr_x").mkdir()
        with pytest.raises(SandboxError, match=r'storage\.backend = "none"'):
            open_storage(plain, StorageConfig())
    finally:
        remove_state_dir(plain)
