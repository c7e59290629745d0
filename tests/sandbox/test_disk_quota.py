"""The per-container disk quota: the overlay's upper layer (``/home/user`` and every other
rootfs path) and ``/mnt/data`` count against one limit the kernel enforces; past it writes
fail inside and on the host's side of the container, while other containers and the host
write on; after ``rm`` the container writes again, after a restart too. Small quotas keep it
fast."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir, run1

from shellbox.errors import SandboxError
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.sandbox.idmap import IMAGE_UID_BASE
from shellbox.sandbox.oci import SANDBOX_UID
from shellbox.sandbox.storage import StorageConfig, open_storage
from shellbox.settings import Settings

MiB = 1 << 20
QUOTA = 64 * MiB
FULL = "Disk quota exceeded"
# A btrfs subvolume made from inside (anyone may, where they can write): BTRFS_IOC_SUBVOL_CREATE.
MAKE_SUBVOLUME = (
    'python3 -c \'import fcntl, os, struct; fd = os.open("/mnt/data", os.O_RDONLY); '
    'fcntl.ioctl(fd, 0x5000940E, bytearray(struct.pack("q", 0) + b"sub".ljust(4088, b"\\0")))\''
)


@pytest.fixture(scope="module")
def quota_state() -> Iterator[Path]:
    path = make_state_dir("shellbox-quota-")
    yield path
    remove_state_dir(path)


@pytest.fixture(scope="module")
async def rt(quota_state: Path) -> AsyncIterator[OciRuntime]:
    runtime = create_runtime(Settings(state_dir=quota_state, runtime={"image_dir": IMAGE_DIR}))
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


async def test_a_subvolume_made_inside_counts_against_the_quota(rt: OciRuntime) -> None:
    cid = await started(rt)
    try:
        made = await run1(rt, cid, MAKE_SUBVOLUME + " && stat -c %i /mnt/data/sub")
        assert made.stdout == "256\n", made  # a subvolume root: it has a qgroup of its own
        escape = await run1(rt, cid, "fallocate -l 100M /mnt/data/sub/x")
        assert escape.outcome.exit_code != 0 and FULL in escape.stderr, escape
    finally:
        await rt.destroy(cid)  # with the subvolume inside
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
        await rt.update_spec(ContainerSpec(id=cid, disk_limit_bytes=256 * MiB))
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
    assert (rt.disk_usage(cid) or 0) >= 10 * MiB
    await rt.destroy(cid)
    assert not rt.storage.path(cid).exists()
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


def test_a_state_directory_keeps_its_backend(rt: OciRuntime) -> None:
    with pytest.raises(SandboxError, match='must stay "btrfs"'):
        open_storage(rt.state_dir, StorageConfig(backend="none"))
    plain = make_state_dir("shellbox-plain-")
    try:
        (open_storage(plain, StorageConfig(backend="none")).root / "cntr_x").mkdir()
        with pytest.raises(SandboxError, match=r'storage\.backend = "none"'):
            open_storage(plain, StorageConfig())
    finally:
        remove_state_dir(plain)
