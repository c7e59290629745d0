"""The mount namespace the OCI runtime binary runs in.

Two things need a mount namespace other than the host's for ``crun``/``runc``:

* hybrid cgroup hosts: crun 1.8 refuses them, but with ``/sys/fs/cgroup/unified`` unmounted
  it uses plain v1. An empty tmpfs goes in its place, so that what crun writes for the v2
  hierarchy it believes in lands in a throwaway filesystem, not in the host's
  ``/sys/fs/cgroup`` tmpfs (where it would pile up, invisible, one directory per container);
* ``run``: the container's overlay root is mounted there, so the mount never appears on the
  host, and a crash of the server can never leave one behind.

**Fast path.** The process that owns the runtime enters a mount namespace of its own once
(``enter_private_namespace``), while it is still single-threaded (``unshare(CLONE_NEWNS)``
refuses a process with threads). The mounts it makes there do not propagate to the host
(the mounts holding them are made slaves, non-recursively), ``/run/netns`` stays shared with
the host (``ip netns add`` from either side is seen by both), and the namespace disappears
with the process. Every OCI call is then a plain ``vfork``+``exec``; overlays are mounted
in-process just before ``crun run`` and detached right after (the container keeps its own
copy).

**Fallback**, for a process that already has threads: each call's forked child sets up a
namespace of its own and ``execve``s the runtime itself (``exec_in``). That costs a real
``fork()`` of the calling process: ~1.7 ms for a small one, ~6 ms at 300 MB resident here
(the old way, ``unshare ... sh -c 'umount ...; mount ...; exec crun'``, cost ~8 ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass

from shellbox.sandbox import idmap

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_REMOUNT = 0x20
MNT_DETACH = 0x2
UNIFIED_PAGES_PER_CONTAINER = 1  # cgroup.procs
UNIFIED_INODES_PER_CONTAINER = 2  # its directory and cgroup.procs
UNIFIED = b"/sys/fs/cgroup/unified"
NETNS_DIR = "/run/netns"
MAX_FD = 65536

_libc = ctypes.CDLL(None, use_errno=True)
_entered: bool | None = None  # None: not tried yet
_unified_for = 0  # containers the stand-in for the cgroup2 mount has room for
_lock = threading.Lock()


@dataclass(frozen=True)
class Namespace:
    """What to set up in a private mount namespace before the runtime binary starts."""

    hybrid: bool = False
    overlay_options: str = ""  # "lowerdir=...,upperdir=...,workdir=..."
    overlay_target: str = ""
    image: str = ""  # mounted id-mapped at overlay_target first, shifted to image_base
    image_base: int = 0

    @property
    def needed(self) -> bool:
        return self.hybrid or bool(self.overlay_options)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unified_options(containers: int) -> bytes:
    """Room in the stand-in for ``/sys/fs/cgroup/unified`` for ``containers`` running at once:
    crun makes a directory and a ``cgroup.procs`` file there per container, and the file
    takes a page. Sized from the host's container limit (``runtime.uid_range_count``), twice
    over; a tmpfs takes memory only for what it holds."""
    containers = max(containers, 64)
    pages = 2 * containers * UNIFIED_PAGES_PER_CONTAINER
    inodes = 2 * containers * UNIFIED_INODES_PER_CONTAINER + 1024
    return f"size={pages * 4}k,nr_inodes={inodes},mode=755".encode()


def _hide_unified(containers: int, clean: bool = False) -> None:
    _libc.umount2(UNIFIED, MNT_DETACH)  # absent already: fine
    if clean:
        # What crun wrote there before this module put a tmpfs in the way: directories in the
        # host's /sys/fs/cgroup tmpfs, under the cgroup2 mount, invisible from the host.
        shutil.rmtree(UNIFIED.decode() + "/shellbox", ignore_errors=True)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(
        _libc.mount(b"tmpfs", UNIFIED, b"tmpfs", flags, unified_options(containers)),
        "mount a tmpfs on /sys/fs/cgroup/unified",
    )


def make_room_for(containers: int) -> None:
    """Grow this process's stand-in for ``/sys/fs/cgroup/unified`` to hold ``containers``
    (a second runtime in the process may allow more than the first)."""
    global _unified_for
    if _entered and _unified_for and containers > _unified_for:
        flags = MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(
            _libc.mount(b"tmpfs", UNIFIED, b"tmpfs", flags, unified_options(containers)),
            "grow the tmpfs on /sys/fs/cgroup/unified",
        )
        _unified_for = containers


def mount_overlay(target: str, options: str) -> None:
    _check(
        _libc.mount(b"overlay", os.fsencode(target), b"overlay", 0, os.fsencode(options)),
        "mount the overlay root",
    )


def detach(target: str) -> None:
    _libc.umount2(os.fsencode(target), MNT_DETACH)


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def mount_point(path: str) -> str:
    """The mount point of the mount that holds ``path`` in this mount namespace."""
    path = os.path.realpath(path)
    best = "/"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best = point
    return best


def _is_mount_point(path: str) -> bool:
    return mount_point(path) == os.path.realpath(path)


def _share_netns_dir() -> None:
    """Make ``/run/netns`` a shared mount on the host, as ``ip netns add`` does on first use,
    so that network namespaces named from any mount namespace are seen from all of them."""
    os.makedirs(NETNS_DIR, exist_ok=True)
    if not _is_mount_point(NETNS_DIR):
        _check(_libc.mount(NETNS_DIR.encode(), NETNS_DIR.encode(), None, MS_BIND, None), "bind")
    _check(_libc.mount(None, NETNS_DIR.encode(), None, MS_SHARED, None), "share /run/netns")


def keep_mounts_under(path: str) -> None:
    """Make sure that what is mounted under ``path`` in this namespace (overlay roots) does
    not propagate to the host: the mount holding it becomes a slave (non-recursively)."""
    if _entered:
        _libc.mount(None, os.fsencode(mount_point(path)), None, MS_SLAVE, None)


def enter_private_namespace(hybrid: bool, containers: int) -> bool:
    """Move this process into a mount namespace of its own, once.

    Mounts made here (the overlay roots, the stand-in for ``/sys/fs/cgroup/unified``) stay
    here, and disappear with the process; ``/run/netns`` stays a peer of the host's, so
    network namespaces named here (egress) and there are seen by both; ``containers``: how
    many may run at once (the stand-in's size). Returns whether the
    process now runs in one; False when it could not (it has threads already, or lacks the
    privilege), in which case callers use ``exec_in`` per call.
    """
    global _entered, _unified_for
    with _lock:
        if _entered is None:
            _entered = False
            if not _single_threaded():
                return False
            with contextlib.suppress(OSError):  # no named network namespaces here, then
                _share_netns_dir()
            if _libc.unshare(CLONE_NEWNS) != 0:
                return False
            _entered = True
            if hybrid:
                for point in (b"/sys/fs/cgroup", UNIFIED):  # neither unmount nor tmpfs leaks
                    _libc.mount(None, point, None, MS_SLAVE, None)
                _hide_unified(containers, clean=True)
                _unified_for = containers
        return _entered


def in_private_namespace() -> bool:
    return bool(_entered)


def forget_unified(container_id: str) -> None:
    """Remove what crun wrote for a container in this process's stand-in for the cgroup2
    mount (a tmpfs that lives as long as the process)."""
    if _entered:
        shutil.rmtree(f"{UNIFIED.decode()}/shellbox/{container_id}", ignore_errors=True)


def exec_in(ns: Namespace, argv: list[str], env: dict[str, str]) -> Callable[[], None]:
    """A ``preexec_fn`` that sets up ``ns`` in a namespace of its own, then becomes ``argv``.

    It execs rather than returning, so that nothing of Popen's runs in between. On failure it
    reports on stderr and exits 125, so the caller sees an ordinary failed run with a message.
    """

    def child() -> None:
        try:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
            if ns.hybrid:
                _hide_unified(1)  # this call's own, for one container
            if ns.image:
                idmap.mount_image(ns.image, ns.overlay_target, ns.image_base)
            if ns.overlay_options:
                mount_overlay(ns.overlay_target, ns.overlay_options)
            os.closerange(3, MAX_FD)  # also Popen's error pipe: exec counts as done
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            try:
                os.write(2, f"shellbox: cannot start {argv[0]}: {exc}\n".encode())
            finally:
                os._exit(125)

    return child
