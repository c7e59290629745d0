"""Host uid ranges, one per container, and the id-mapped view of the shared image each needs.

Every container gets ``RANGE_SIZE`` host uids of its own (container uid 0 is the range's
base): a process that escapes one container's user namespace is a host uid that owns that
container's files and nothing of any other's. The writable parts of a container (overlay
upper layer, ``/mnt/data``) are owned by its range; the shared image stays stored with its
owners shifted by ``IMAGE_UID_BASE`` and is seen through an *id-mapped mount* that shifts
``IMAGE_UID_BASE + n`` to ``base + n`` (kernel 5.19+ takes one as an overlay lower layer),
so nothing is copied or chowned per container. Setting one up costs ~1 ms per start.

Ranges are claimed host-wide, so every shellbox server on the host (each state directory)
draws from one pool without collisions: claim ``i`` is the file ``<claims_dir>/<i>``, made
with ``O_EXCL``, holding the container directory it belongs to, and the container directory
records its base (``RANGE_FILE``), which is how it keeps it across restarts of the server and
of the host. A claim whose container directory is gone (or records another range) is stale
and is taken back when the pool runs out. Containers made before ranges existed have no
``RANGE_FILE`` and keep ``IMAGE_UID_BASE`` (they need no id-mapped image).

The default pool, 0x70000000 up to systemd's foreign range at 0x7FFE0000, lies above the
ranges ``useradd`` hands out in ``/etc/subuid`` and systemd's container ranges; the runtime
refuses to start when a host user, group or subordinate range overlaps it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shellbox.errors import CapacityExceeded, SandboxError

IMAGE_UID_BASE = 100_000  # how image.py stores the image's owners; must match image.py
RANGE_SIZE = 65_536
RANGE_FILE = "uid_base"  # in the container directory: its range's first host uid
DEFAULT_FIRST = 0x7000_0000  # must match settings.py
DEFAULT_COUNT = (0x7FFE_0000 - DEFAULT_FIRST) // RANGE_SIZE
DEFAULT_CLAIMS_DIR = Path("/var/lib/shellbox-uid-ranges")  # must match settings.py

_libc = ctypes.CDLL(None, use_errno=True)
_libc.clone.restype = ctypes.c_int
_libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
CLONE_VM = 0x100
CLONE_NEWUSER = 0x10000000
WALL = 0x40000000  # waitpid: any child, whatever signal it reports its end with
SYS_PAUSE = 34
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_IDMAP = 0x0010_0000
MS_PRIVATE = 1 << 18
_STACK = ctypes.create_string_buffer(16384)  # the helper's stack: it only ever calls pause
_stack_lock = threading.Lock()


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _fail(what: str) -> SandboxError:
    err = ctypes.get_errno()
    return SandboxError(f"{what}: {os.strerror(err)}")


def userns_fd(inside: int, outside: int, count: int) -> int:
    """A descriptor of a new user namespace that maps ``inside..+count`` to host
    ``outside..+count`` (uids and gids), for ``mount_setattr``.

    A namespace needs a process: a ``clone(CLONE_NEWUSER | CLONE_VM)`` child that shares our
    memory (so nothing is copied, unlike ``fork``) and runs only ``pause`` on a stack of its
    own, then is killed once its maps are written and its namespace is open (~0.4 ms).
    """
    syscall = ctypes.cast(_libc.syscall, ctypes.c_void_p).value
    with _stack_lock:
        top = (ctypes.addressof(_STACK) + len(_STACK) - 64) & ~15
        pid = _libc.clone(syscall, top, CLONE_VM | CLONE_NEWUSER, SYS_PAUSE)
        if pid < 0:
            msg = "clone a user namespace for an id-mapped mount"
            raise _fail(msg)
        try:
            line = f"{inside} {outside} {count}\n"
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(line)
            return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, WALL)


def mount_idmapped(source: str, target: str, ns_fd: int) -> None:
    """Bind ``source`` onto ``target`` with the owners shifted as ``ns_fd``'s maps say.

    The bind is made private in the same call. ``open_tree`` clones ``source``'s mount into
    its peer group; left there, whatever is later mounted on ``target`` (the overlay root)
    propagates back onto ``source`` itself in every namespace holding a peer: the host's
    too, wherever the image's filesystem is a shared mount (systemd makes every mount
    shared). The next start's clone of ``source`` is then that overlay, which cannot be
    id-mapped ("Invalid argument"), and meanwhile one container's root lies on the image.
    """
    fd = _libc.syscall(
        SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
    )
    if fd < 0:
        msg = f"open_tree {source}"
        raise _fail(msg)
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, MS_PRIVATE, ns_fd)
        size = ctypes.sizeof(attr)
        if _libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), size):
            msg = f"id-map the mount of {source}"
            raise _fail(msg)
        flags = MOVE_MOUNT_F_EMPTY_PATH
        if _libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(target), flags):
            msg = f"move the id-mapped {source} to {target}"
            raise _fail(msg)
    finally:
        os.close(fd)


def mount_image(image: str, target: str, base: int) -> None:
    """The shared image at ``target``, its owners shifted from ``IMAGE_UID_BASE`` to ``base``."""
    ns = userns_fd(IMAGE_UID_BASE, base, RANGE_SIZE)
    try:
        mount_idmapped(image, target, ns)
    finally:
        os.close(ns)


@dataclass
class UidRanges:
    """The host-wide pool of container uid ranges (see the module docstring)."""

    first: int = DEFAULT_FIRST
    count: int = DEFAULT_COUNT
    claims_dir: Path = DEFAULT_CLAIMS_DIR
    _next: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.first % RANGE_SIZE or self.first < 2 * RANGE_SIZE or self.count < 1:
            msg = (
                f"runtime.uid_range_first ({self.first}) must be a multiple of {RANGE_SIZE} "
                f"above {RANGE_SIZE}, and runtime.uid_range_count ({self.count}) at least 1"
            )
            raise SandboxError(msg)
        if self.first + self.count * RANGE_SIZE > 0xFFFF_FFFF:
            msg = "runtime.uid_range_first + uid_range_count * 65536 passes the last uid"
            raise SandboxError(msg)
        image = range(IMAGE_UID_BASE, IMAGE_UID_BASE + RANGE_SIZE)
        if _overlaps(image, self.span):
            msg = f"the uid ranges must not overlap the image's ({IMAGE_UID_BASE}+)"
            raise SandboxError(msg)

    @property
    def span(self) -> range:
        return range(self.first, self.first + self.count * RANGE_SIZE)

    def base(self, index: int) -> int:
        return self.first + index * RANGE_SIZE

    def index(self, base: int) -> int | None:
        offset = base - self.first
        if offset < 0 or offset % RANGE_SIZE or offset // RANGE_SIZE >= self.count:
            return None
        return offset // RANGE_SIZE

    def check_host(self, etc: Path = Path("/etc")) -> None:
        """Refuse a pool that overlaps a host user or group, or a subordinate id range."""
        clashes: list[str] = []
        for name in ("passwd", "group"):
            for line in _lines(etc / name):
                parts = line.split(":")
                if len(parts) > 2 and parts[2].isdigit() and int(parts[2]) in self.span:
                    clashes.append(f"{name} {parts[0]} ({parts[2]})")
        for name in ("subuid", "subgid"):
            for line in _lines(etc / name):
                parts = line.split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    start, size = int(parts[1]), int(parts[2])
                    if _overlaps(range(start, start + size), self.span):
                        clashes.append(f"{name} {parts[0]} ({start}+{size})")
        if clashes:
            msg = (
                f"the container uid ranges {self.span.start}..{self.span.stop - 1} "
                f"(runtime.uid_range_first, runtime.uid_range_count) overlap host ids: "
                f"{', '.join(clashes[:5])}; move them elsewhere"
            )
            raise SandboxError(msg)

    # -- claims -----------------------------------------------------------------------------

    def claim(self, owner: Path) -> int:
        """Claim a free range for the container directory ``owner``; returns its base."""
        self.claims_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for step in range(self.count):
            index = (self._next + step) % self.count
            if self._create(index, owner):
                self._next = index + 1
                return self.base(index)
        with self._locked():  # every range is claimed: take back those of gone containers
            for index in range(self.count):
                if self._stale(index):
                    (self.claims_dir / str(index)).unlink(missing_ok=True)
            for index in range(self.count):
                if self._create(index, owner):
                    self._next = index + 1
                    return self.base(index)
        msg = (
            f"this host already holds {self.count} containers, the most it may "
            f"(runtime.uid_range_count); delete some or retry later"
        )
        raise CapacityExceeded(msg)

    def hold(self, base: int, owner: Path) -> None:
        """Make sure ``owner`` holds the range at ``base`` (a server restart, a host reboot
        with another claims directory): claims it again when free or stale."""
        index = self.index(base)
        if index is None:
            return  # the image's own range (containers made before ranges existed)
        if self._owner(index) == owner:
            return
        self.claims_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._locked():
            if self._owner(index) is not None and self._stale(index):
                (self.claims_dir / str(index)).unlink(missing_ok=True)
            if self._create(index, owner) or self._owner(index) == owner:
                return
        msg = f"uid range {base} of {owner.name} is claimed by {self._owner(index)}"
        raise SandboxError(msg)

    def release(self, base: int, owner: Path) -> None:
        index = self.index(base)
        if index is not None and self._owner(index) == owner:
            (self.claims_dir / str(index)).unlink(missing_ok=True)

    def _create(self, index: int, owner: Path) -> bool:
        path = self.claims_dir / str(index)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{owner}\n")
        return True

    def _owner(self, index: int) -> Path | None:
        try:
            text = (self.claims_dir / str(index)).read_text().strip()
        except FileNotFoundError:
            return None
        return Path(text) if text else Path()

    def _stale(self, index: int) -> bool:
        """The claim's container directory is gone, or records another range. (One that
        records none yet is being created.)"""
        owner = self._owner(index)
        if owner is None or owner == Path():
            return owner is not None and _older_than(self.claims_dir / str(index), 60)
        if not owner.is_dir():
            return True
        try:
            recorded = int((owner / RANGE_FILE).read_text())
        except FileNotFoundError:
            return False
        except ValueError:
            return True
        return recorded != self.base(index)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.claims_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def shift_tree(top: Path, old_base: int, new_base: int) -> int:
    """Move every file under ``top`` owned by the range at ``old_base`` to the range at
    ``new_base`` (uid and gid apart); returns how many inodes changed. Symbolic links are
    changed themselves, never followed; an inode met again through a hard link is already
    outside the old range. ``chown`` clears set-user-ID and set-group-ID bits: they are put
    back. (POSIX ACL entries and v3 file capabilities, which also name uids, are left.)"""
    old = range(old_base, old_base + RANGE_SIZE)
    changed = 0

    def shift(path: str) -> None:
        nonlocal changed
        st = os.lstat(path)
        uid = st.st_uid - old_base + new_base if st.st_uid in old else st.st_uid
        gid = st.st_gid - old_base + new_base if st.st_gid in old else st.st_gid
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        os.lchown(path, uid, gid)
        changed += 1
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISLNK(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode))

    shift(str(top))
    for root, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            shift(os.path.join(root, name))
    return changed


def read_base(container_dir: Path) -> int | None:
    """The range base a container directory records; None when it records none."""
    try:
        return int((container_dir / RANGE_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        msg = f"{container_dir / RANGE_FILE} does not hold a uid"
        raise SandboxError(msg) from None


def write_base(container_dir: Path, base: int) -> None:
    tmp = container_dir / f".{RANGE_FILE}.tmp"
    tmp.write_text(f"{base}\n")
    tmp.rename(container_dir / RANGE_FILE)


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line and line[0] != "#"]
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except FileNotFoundError:
        return False
