"""Where containers' writable state lives: one btrfs filesystem, a subvolume per container,
each with a disk quota the kernel enforces.

Layout: the filesystem is mounted at ``<state>/disks``; a container's disk is the subvolume
``<state>/disks/<id>/`` holding its overlay's ``upper/`` and ``work/`` (so ``/home/user`` and
every other rootfs path) and ``data/`` (``/mnt/data``). One quota counts all three. What the
host writes for a container (``spec.json``, ``config.json``, its log) stays outside, in
``<state>/containers/<id>/``, so a container whose disk is full still restarts.

Why btrfs: this kernel is built without XFS quotas (``CONFIG_XFS_QUOTA`` unset) and without
the quota formats ext4 needs (``CONFIG_QFMT_V2``), so project quotas are out; btrfs qgroups
need no option. Subvolumes also give the O(1) copy-on-write snapshots forks will need.
A write past the quota fails with EDQUOT ("Disk quota exceeded"), btrfs's errno for it.

Quotas are btrfs *simple quotas* where the kernel has them (6.7+): usage is charged when an
extent is allocated and released when it is freed, with no backref walks. Each container gets
a level-1 qgroup ``1/<subvolume id>`` holding the limit, its subvolume ``0/<id>`` a member.
Elsewhere (Debian 12's 6.1) they are regular qgroups, the limit on the subvolume's own qgroup
``0/<id>``; usage there is settled at transaction commit, and a write that meets the limit
makes the kernel commit and retry before it answers EDQUOT, so freed space counts at once.
``storage.quota_mode`` picks one ("auto": simple when the kernel can); a filesystem keeps the
mode it was first given, since switching would drop every container's limit.

Anyone may create a subvolume in a directory they can write (uid 1000 in ``/mnt/data``
included), and a new subvolume's own qgroup has no limit: under regular qgroups it would hold
any amount outside the container's quota. The container's seccomp filter refuses the ioctls
that make subvolumes and snapshots (``oci.BTRFS_SUBVOLUME_IOCTLS``), whatever the mode.

Per container this costs four ioctls (~0.13 ms here; three with regular qgroups); the
filesystem is made (sparse image, ``mkfs.btrfs``, ~0.2 s) once and mounted (~0.1-0.5 s) when
a runtime opens the state directory. The image is mounted through a loop device in the
runtime's own mount namespace (``hostns``), like the overlays: nothing is left mounted on the
host, and the loop device (auto-clear) goes away with the last mount and the last container
using it. ``mount -o loop`` reuses the loop device already attached to the image, so two
processes (the server, the CLI) and containers that outlived a server share one filesystem
instance.

Snapshots (``<disks>/.snapshots/<id>``, read-only) and forks (a writable snapshot of one, as
a container's disk) share every extent until one side writes. Under simple quotas an extent
stays charged to the subvolume that wrote it, even once that subvolume is gone: a snapshot's
and a fork's own qgroups count only what they wrote themselves (measured: 16 KiB each for a
10 MiB origin), so a fork's quota limits its new writes, and what a snapshot holds is
reported as what its container's disk held when it was taken.

Freed space goes back to the host: btrfs turns on asynchronous discard on a loop device,
which punches holes in the image. The image's size (``storage.size_gb``) caps what all
containers together can hold.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shellbox.errors import SandboxError, SnapshotNotFound, SnapshotsUnavailable
from shellbox.sandbox import hostns

log = logging.getLogger("shellbox.sandbox")

# <linux/btrfs.h>: _IOW/_IOR/_IOWR(0x94, nr, struct ...)
IOC_SYNC = 0x9408  # _IO(0x94, 8): commit the transaction
IOC_SUBVOL_CREATE = 0x5000940E  # struct btrfs_ioctl_vol_args (4096 bytes)
IOC_SNAP_DESTROY = 0x5000940F
IOC_SNAP_CREATE_V2 = 0x50009417  # struct btrfs_ioctl_vol_args_v2 (4096 bytes)
IOC_SUBVOL_SETFLAGS = 0x4008941A  # __u64 flags
SUBVOL_RDONLY = 1 << 1
IOC_INO_LOOKUP = 0xD0009412  # struct btrfs_ioctl_ino_lookup_args (4096 bytes)
IOC_FS_INFO = 0x8400941F  # struct btrfs_ioctl_fs_info_args (1024 bytes)
IOC_QUOTA_CTL = 0xC0109428  # struct btrfs_ioctl_quota_ctl_args {cmd, status}
IOC_QGROUP_ASSIGN = 0x40189429  # {assign, src, dst}
IOC_QGROUP_CREATE = 0x4010942A  # {create, qgroupid}
IOC_QGROUP_LIMIT = 0x8030942B  # {qgroupid, {flags, max_rfer, max_excl, rsv_rfer, rsv_excl}}
QUOTA_CTL_ENABLE = 1
QUOTA_CTL_ENABLE_SIMPLE_QUOTA = 4
QGROUP_LIMIT_MAX_RFER = 1
FIRST_FREE_OBJECTID = 256  # the inode number of every subvolume's root directory
LEVEL_1 = 1 << 48  # qgroup id "1/<n>"

QuotaMode = Literal["simple", "qgroup"]
# /sys/fs/btrfs/<fsid>/qgroups/mode says (6.7+); before, quotas could only be regular ones.
SYSFS_MODES: dict[str, QuotaMode] = {"squota": "simple", "qgroup": "qgroup"}

# Room for the overlay's mount on a full disk: it empties and remakes its work directory, and
# under regular qgroups (6.1) the metadata reservation for that fails at the limit.
LIFT_BYTES = 16 << 20

DEFAULT_IMAGE = "disks.img"
# Snapshots live beside the containers' disks, in a directory no container id can name
# (ids never start with a dot), root's and 0700: their files keep the uids of the container
# they were taken from, so no container's uids may reach them.
SNAPSHOTS_DIR = ".snapshots"
MOUNT_OPTIONS = "nosuid,nodev,noatime"


@dataclass(frozen=True)
class StorageConfig:
    """Where the filesystem comes from (``settings.storage``)."""

    backend: Literal["btrfs", "none"] = "btrfs"
    device: Path | None = None  # a block device or image file with a btrfs on it
    size_gb: float = 64.0  # of the image made when ``device`` is not given
    quota_mode: Literal["auto", "simple", "qgroup"] = "auto"


def _vol_args(name: str) -> bytearray:
    return bytearray(struct.pack("q", 0) + os.fsencode(name).ljust(4088, b"\0"))


def _snap_args(source_fd: int, name: str, *, read_only: bool) -> bytearray:
    """struct btrfs_ioctl_vol_args_v2: fd, transid, flags, 32 bytes of union, name[4040]."""
    flags = SUBVOL_RDONLY if read_only else 0
    head = struct.pack("qQQ", source_fd, 0, flags) + bytes(32)
    return bytearray(head + os.fsencode(name).ljust(4040, b"\0"))


def _subvolume_id(fd: int) -> int:
    """The id of the subvolume an open file or directory is in."""
    buf = bytearray(struct.pack("QQ", 0, FIRST_FREE_OBJECTID) + bytes(4080))
    fcntl.ioctl(fd, IOC_INO_LOOKUP, buf)
    return int(struct.unpack_from("Q", buf)[0])


def _set_limit(fd: int, qgroup: int, limit_bytes: int) -> None:
    args = struct.pack("QQQQQQ", qgroup, QGROUP_LIMIT_MAX_RFER, limit_bytes, 0, 0, 0)
    fcntl.ioctl(fd, IOC_QGROUP_LIMIT, bytearray(args))


def _limited_qgroup(mode: QuotaMode, subvol: int) -> int:
    """The qgroup holding a container's limit: level 1 for simple quotas, its own otherwise."""
    return LEVEL_1 | subvol if mode == "simple" else subvol


class Storage:
    """The containers' disks under ``root``; with a ``quota_mode``, btrfs subvolumes with
    limits, without (``storage.backend = "none"``), plain directories on the host's
    filesystem."""

    def __init__(self, root: Path, *, quota_mode: QuotaMode | None) -> None:
        self.root = root
        self.quota_mode = quota_mode
        self.quotas = quota_mode is not None

    def path(self, container_id: str) -> Path:
        return self.root / container_id

    def create(self, container_id: str, limit_bytes: int) -> Path:
        """Make the container's disk (empty) with its quota; returns its path."""
        path = self.path(container_id)
        if self.quota_mode is None:
            path.mkdir(exist_ok=True)
            return path
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # EEXIST: made by an earlier, interrupted create; its quota is set again.
            with contextlib.suppress(FileExistsError):
                fcntl.ioctl(root_fd, IOC_SUBVOL_CREATE, _vol_args(container_id))
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._set_quota(fd, limit_bytes)
            finally:
                os.close(fd)
        finally:
            os.close(root_fd)
        return path

    def _set_quota(self, fd: int, limit_bytes: int) -> None:
        """Give the subvolume open at ``fd`` its container's qgroup and limit."""
        assert self.quota_mode is not None
        subvol = _subvolume_id(fd)
        qgroup = _limited_qgroup(self.quota_mode, subvol)
        if qgroup != subvol:  # the subvolume's own qgroup is made with it
            with contextlib.suppress(FileExistsError):
                fcntl.ioctl(fd, IOC_QGROUP_CREATE, bytearray(struct.pack("QQ", 1, qgroup)))
            with contextlib.suppress(FileExistsError):
                args = struct.pack("QQQ", 1, subvol, qgroup)
                fcntl.ioctl(fd, IOC_QGROUP_ASSIGN, bytearray(args))
        _set_limit(fd, qgroup, limit_bytes)

    # -- snapshots --------------------------------------------------------------------------

    @property
    def snapshots_root(self) -> Path:
        return self.root / SNAPSHOTS_DIR

    def snapshot_path(self, snapshot_id: str) -> Path:
        return self.snapshots_root / snapshot_id

    def check_snapshots(self) -> None:
        if self.quota_mode is None:
            msg = (
                'snapshots need copy-on-write storage: this server has storage.backend = "none"'
                ' (plain directories); set it to "btrfs"'
            )
            raise SnapshotsUnavailable(msg)

    def sync(self, container_id: str) -> None:
        """Write the container's dirty pages back and commit (``BTRFS_IOC_SYNC``)."""
        if self.quota_mode is None:
            return
        fd = os.open(self.path(container_id), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, IOC_SYNC)
        finally:
            os.close(fd)

    def snapshot(self, container_id: str, snapshot_id: str) -> None:
        """A read-only snapshot of the container's disk (upper, work, data): O(1), the
        extents are shared copy-on-write. The kernel flushes the subvolume's dirty pages
        first, so what the container wrote before this call is in it."""
        self.check_snapshots()
        self.snapshots_root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.snapshots_root, 0o700)
        source = os.open(self.path(container_id), os.O_RDONLY | os.O_DIRECTORY)
        try:
            if os.fstat(source).st_ino != FIRST_FREE_OBJECTID:
                msg = f"the disk of {container_id} is not a subvolume (made before disks existed)"
                raise SnapshotsUnavailable(msg)
            target = os.open(self.snapshots_root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                args = _snap_args(source, snapshot_id, read_only=True)
                fcntl.ioctl(target, IOC_SNAP_CREATE_V2, args)
            finally:
                os.close(target)
        finally:
            os.close(source)

    def fork(self, snapshot_id: str, container_id: str, limit_bytes: int) -> Path:
        """A writable snapshot of a snapshot as a new container's disk, with its own quota;
        returns its path. Independent of its snapshot and of every other fork: a write
        copies only the extents it touches."""
        self.check_snapshots()
        path = self.path(container_id)
        try:
            source = os.open(self.snapshot_path(snapshot_id), os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # deleted meanwhile, or taken by another server's disks
            msg = f"snapshot {snapshot_id} is not stored on this server's disks"
            raise SnapshotNotFound(msg, param="snapshot_id") from None
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                args = _snap_args(source, container_id, read_only=False)
                fcntl.ioctl(root_fd, IOC_SNAP_CREATE_V2, args)
            finally:
                os.close(root_fd)
        finally:
            os.close(source)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._set_quota(fd, limit_bytes)
        finally:
            os.close(fd)
        return path

    def remove_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot and its qgroup; idempotent. Forks made from it keep their data:
        btrfs frees an extent when the last subvolume referring to it is gone."""
        if self.quota_mode is None:
            return
        path = self.snapshot_path(snapshot_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return
        try:
            subvol = _subvolume_id(fd)
        finally:
            os.close(fd)
        root_fd = os.open(self.snapshots_root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # A read-only subvolume can be destroyed by root as it is.
            fcntl.ioctl(root_fd, IOC_SNAP_DESTROY, _vol_args(snapshot_id))
            if self.quota_mode == "qgroup":
                self._remove_level_0(root_fd, subvol, snapshot_id)
        finally:
            os.close(root_fd)

    def snapshot_ids(self) -> list[str]:
        root = self.snapshots_root
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    def set_limit(self, container_id: str, limit_bytes: int) -> None:
        """Change the quota of an existing disk (a pooled container taken for a request)."""
        if self.quota_mode is None:
            return
        fd = os.open(self.path(container_id), os.O_RDONLY | os.O_DIRECTORY)
        try:
            _set_limit(fd, _limited_qgroup(self.quota_mode, _subvolume_id(fd)), limit_bytes)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lifted(self, container_id: str, limit_bytes: int) -> Iterator[None]:
        """The quota raised by ``LIFT_BYTES`` for host work that must succeed on a full disk,
        then ``limit_bytes`` again."""
        self.set_limit(container_id, limit_bytes + LIFT_BYTES)
        try:
            yield
        finally:
            self.set_limit(container_id, limit_bytes)

    def qgroup(self, container_id: str) -> Path | None:
        """The sysfs directory of the container's quota (None: no quota, or no such disk)."""
        if self.quota_mode is None:
            return None
        try:
            fd = os.open(self.path(container_id), os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return None
        try:
            level = 1 if self.quota_mode == "simple" else 0
            path = Path(f"/sys/fs/btrfs/{_fsid(fd)}/qgroups/{level}_{_subvolume_id(fd)}")
        finally:
            os.close(fd)
        return path if path.is_dir() else None

    def usage(self, container_id: str) -> int | None:
        """Bytes the container's disk holds against its quota (None: it has none)."""
        qgroup = self.qgroup(container_id)
        if qgroup is None:
            return None
        if self.quota_mode == "qgroup":  # regular qgroups count at commit: commit first
            try:
                fd = os.open(self.path(container_id), os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                return None
            try:
                fcntl.ioctl(fd, IOC_SYNC)
            finally:
                os.close(fd)
        try:
            return int((qgroup / "referenced").read_text())
        except FileNotFoundError:  # destroyed meanwhile
            return None

    def remove(self, container_id: str) -> None:
        """Delete the disk and its qgroup; idempotent."""
        path = self.path(container_id)
        if not self.quotas:
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return
        try:
            is_subvolume = os.fstat(fd).st_ino == FIRST_FREE_OBJECTID
            subvol = _subvolume_id(fd) if is_subvolume else None
        finally:
            os.close(fd)
        if subvol is None:  # a leftover plain directory
            shutil.rmtree(path, ignore_errors=True)
            return
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                # O(1): the cleaner thread frees the extents in the background.
                fcntl.ioctl(root_fd, IOC_SNAP_DESTROY, _vol_args(container_id))
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise
                # It holds subvolumes made inside: rmdir deletes an empty subvolume, so a
                # walk removes them and then the container's own.
                shutil.rmtree(path)
            if self.quota_mode == "simple":
                self._remove_level_1(root_fd, subvol, container_id)
            else:
                self._remove_level_0(root_fd, subvol, container_id)
        finally:
            os.close(root_fd)

    def _remove_level_0(self, root_fd: int, subvol: int, container_id: str) -> None:
        # The kernel refuses (EBUSY) while the subvolume holds data, i.e. until the cleaner
        # has dropped it; 6.10+ then removes the qgroup itself, older kernels leave it, so
        # later removals sweep what earlier ones left (``btrfs qgroup clear-stale``).
        try:
            fcntl.ioctl(root_fd, IOC_QGROUP_CREATE, bytearray(struct.pack("QQ", 0, subvol)))
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOENT):
                log.warning("could not remove qgroup 0/%d of %s: %s", subvol, container_id, exc)
        self.clear_stale_qgroups()

    def clear_stale_qgroups(self) -> int:
        """Remove the regular qgroups of subvolumes that are gone; returns how many. A live
        subvolume's qgroup is never touched: it is not a candidate, and the kernel refuses to
        remove a qgroup that counts any bytes."""
        if self.quota_mode != "qgroup":
            return 0
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            live = {_subvolume_id(root_fd)}  # the top level, 0/5
            snapshots = self.snapshots_root
            entries = [*os.scandir(self.root)]
            if snapshots.is_dir():
                entries += os.scandir(snapshots)
            for entry in entries:
                with contextlib.suppress(OSError):  # being made or removed meanwhile
                    fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        live.add(_subvolume_id(fd))
                    finally:
                        os.close(fd)
            removed = 0
            for qgroup in Path(f"/sys/fs/btrfs/{_fsid(root_fd)}/qgroups").glob("0_*"):
                subvol = int(qgroup.name[2:])
                try:
                    if subvol in live or int((qgroup / "referenced").read_text()) != 0:
                        continue
                    args = bytearray(struct.pack("QQ", 0, subvol))
                    fcntl.ioctl(root_fd, IOC_QGROUP_CREATE, args)
                    removed += 1
                except FileNotFoundError:  # removed meanwhile (by the kernel, 6.10+)
                    continue
                except OSError as exc:  # EBUSY: its subvolume is still being dropped
                    if exc.errno not in (errno.EBUSY, errno.ENOENT):
                        log.warning("could not remove stale qgroup 0/%d: %s", subvol, exc)
            return removed
        finally:
            os.close(root_fd)

    @staticmethod
    def _remove_level_1(root_fd: int, subvol: int, container_id: str) -> None:
        qgroup = LEVEL_1 | subvol
        try:
            args = struct.pack("QQQ", 0, subvol, qgroup)
            fcntl.ioctl(root_fd, IOC_QGROUP_ASSIGN, bytearray(args))
            fcntl.ioctl(root_fd, IOC_QGROUP_CREATE, bytearray(struct.pack("QQ", 0, qgroup)))
        except OSError as exc:  # only bookkeeping is left behind: say so, go on
            log.warning("could not remove qgroup 1/%d of %s: %s", subvol, container_id, exc)


def _fsid(fd: int) -> str:
    buf = bytearray(1024)
    fcntl.ioctl(fd, IOC_FS_INFO, buf)
    raw = bytes(buf[16:32]).hex()
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def _is_btrfs_mount(path: Path) -> bool:
    """Whether a btrfs is mounted right at ``path`` in this mount namespace."""
    target = os.path.realpath(path)
    fstype = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4].replace("\\040", " ") == target:
                fstype = fields[fields.index("-") + 1]  # the last mount there wins
    return fstype == "btrfs"


def open_storage(state_dir: Path, config: StorageConfig) -> Storage:
    """The state directory's container disks, their filesystem made and mounted if needed
    (idempotent: after a restart or a reboot it is mounted again)."""
    root = state_dir / "disks"
    root.mkdir(exist_ok=True)
    if config.backend == "none":
        if (state_dir / DEFAULT_IMAGE).exists():
            msg = (
                f"the containers of {state_dir} have their disks in {DEFAULT_IMAGE}: "
                'storage.backend must stay "btrfs" for this state directory'
            )
            raise SandboxError(msg)
        return Storage(root, quota_mode=None)
    with open(state_dir / "disks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one loop device per image: one mounter at a time
        if not _is_btrfs_mount(root):
            if any(root.iterdir()):
                msg = (
                    f"{root} holds files but no btrfs is mounted there: containers were made "
                    'with storage.backend = "none"; keep that setting for this state directory'
                )
                raise SandboxError(msg)
            _mount(root, _device(state_dir, config))
        mode = _enable_quotas(root, config.quota_mode)
    log.info("container disks: btrfs on %s, %s quotas", root, mode)
    return Storage(root, quota_mode=mode)


def _device(state_dir: Path, config: StorageConfig) -> Path:
    """The named device, or the state directory's image, made (sparse) on first use."""
    if config.device is not None:
        if not config.device.exists():
            msg = f"storage.device {config.device} does not exist"
            raise SandboxError(msg)
        return config.device
    image = state_dir / DEFAULT_IMAGE
    if image.exists():
        return image
    mkfs = shutil.which("mkfs.btrfs")
    if mkfs is None:
        msg = "mkfs.btrfs is not installed (Debian package btrfs-progs); run ./scripts/setup.sh"
        raise SandboxError(msg)
    tmp = image.with_name(f".{image.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.truncate(int(config.size_gb * (1 << 30)))
    done = subprocess.run([mkfs, "-q", str(tmp)], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        msg = f"mkfs.btrfs {tmp} failed: {done.stderr.strip()}"
        raise SandboxError(msg)
    tmp.rename(image)
    return image


def _mount(root: Path, device: Path) -> None:
    options = MOUNT_OPTIONS if device.is_block_device() else f"loop,{MOUNT_OPTIONS}"
    done = subprocess.run(
        ["mount", "-t", "btrfs", "-o", options, str(device), str(root)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        msg = f"cannot mount {device} (btrfs) on {root}: {done.stderr.strip()}"
        raise SandboxError(msg)
    hostns.keep_mounts_under(str(root))


def _quota_ctl(fd: int, cmd: int) -> None:
    fcntl.ioctl(fd, IOC_QUOTA_CTL, bytearray(struct.pack("QQ", cmd, 0)))


def _enable_quotas(root: Path, wanted: Literal["auto", "simple", "qgroup"]) -> QuotaMode:
    """Turn quotas on in the mode asked for (``auto``: simple where the kernel has them), or
    keep the mode the filesystem has: its containers' limits live in that mode's qgroups."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        qgroups = Path(f"/sys/fs/btrfs/{_fsid(fd)}/qgroups")
        current = _current_mode(qgroups)
        if current is not None:
            if wanted not in ("auto", current):
                msg = (
                    f"the btrfs on {root} has {current} quotas, and its containers' limits "
                    f'are kept in them: set storage.quota_mode to "auto" or "{current}"'
                )
                raise SandboxError(msg)
            return current
        if wanted != "qgroup":
            try:
                _quota_ctl(fd, QUOTA_CTL_ENABLE_SIMPLE_QUOTA)
                return "simple"
            except OSError as exc:
                if wanted == "simple":
                    msg = f"cannot enable btrfs simple quotas on {root} (Linux 6.7+): {exc}"
                    raise SandboxError(msg) from None
                log.info("no btrfs simple quotas on this kernel (%s): regular qgroups", exc)
        try:
            _quota_ctl(fd, QUOTA_CTL_ENABLE)
        except OSError as exc:
            msg = f"cannot enable btrfs quotas on {root}: {exc}"
            raise SandboxError(msg) from None
        return "qgroup"
    finally:
        os.close(fd)


def _current_mode(qgroups: Path) -> QuotaMode | None:
    """The filesystem's quota mode, None when quotas are off."""
    if not qgroups.is_dir():
        return None
    try:
        name = (qgroups / "mode").read_text().strip()
    except FileNotFoundError:  # before 6.7: regular qgroups are the only kind
        return "qgroup"
    if name not in SYSFS_MODES:
        msg = f"{qgroups}/mode is {name!r}, a btrfs quota mode shellbox does not know"
        raise SandboxError(msg)
    return SYSFS_MODES[name]
