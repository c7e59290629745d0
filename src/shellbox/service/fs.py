"""Host-side access to a container's ``/mnt/data`` that nothing from a client or a sandbox can
steer outside it.

The sandbox controls everything under its data directory, including symlinks that point at
host paths (``/etc/shadow``) or into another container's tree. So every path is opened one
component at a time from a directory file descriptor with ``O_NOFOLLOW``: a symlink anywhere
on the way is refused, and a directory swapped for a symlink mid-walk cannot redirect us.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shellbox.errors import FileNotFound, InvalidRequest

DATA_MOUNT = "/mnt/data"
MAX_SCAN_ENTRIES = 20_000
MAX_SCAN_DEPTH = 64
# An upload is written to ``.shellbox-upload-<run>-<n>`` next to its target, then renamed. The
# run token tells this process's temporaries (in flight) from those a crashed one left.
UPLOAD_PREFIX = ".shellbox-upload-"
_RUN = secrets.token_hex(6)
_UPLOAD_SEQ = itertools.count()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def relative_path(path: str, *, param: str = "path") -> str:
    """Normalise a client's path (``/mnt/data/a/b``, ``a/b`` or ``./a/b``) to ``a/b``."""
    if not path or "\x00" in path:
        msg = "the path is empty or contains a NUL byte"
        raise InvalidRequest(msg, param=param)
    p = PurePosixPath(path)
    if p.is_absolute():
        try:
            p = p.relative_to(DATA_MOUNT)
        except ValueError:
            msg = f"{path!r} is outside {DATA_MOUNT}; give a path relative to it"
            raise InvalidRequest(msg, param=param) from None
    parts = [part for part in p.parts if part not in ("", ".")]
    if any(part == ".." for part in parts):
        msg = f"{path!r} contains '..'; paths must stay inside {DATA_MOUNT}"
        raise InvalidRequest(msg, param=param)
    if not parts:
        msg = f"{path!r} names the data directory itself, not a file"
        raise InvalidRequest(msg, param=param)
    return "/".join(parts)


@contextlib.contextmanager
def _parent_fd(root: Path, rel: str, *, create: bool = False, uid: int = -1) -> Iterator[int]:
    """Yield an fd of the directory holding ``rel``'s last component, walked without symlinks."""
    parts = rel.split("/")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    created = True
                except FileExistsError:  # the sandbox made it meanwhile: use theirs
                    created = False
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if uid >= 0 and created:
                    os.fchown(nxt, uid, uid)
            os.close(fd)
            fd = nxt
        yield fd
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            msg = f"{rel!r} goes through a symbolic link or a non-directory; refused"
            raise InvalidRequest(msg, param="path") from None
        if exc.errno in (errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY):
            # The sandbox changed the path while we wrote it (a directory appeared there).
            msg = f"{rel!r} changed inside the container while it was being written; try again"
            raise InvalidRequest(msg, param="path") from None
        raise
    finally:
        os.close(fd)


def open_read(root: Path, rel: str) -> int:
    """An fd for reading the regular file ``rel``; symlinks and special files are refused."""
    try:
        with _parent_fd(root, rel) as dfd:
            fd = os.open(
                rel.rsplit("/", 1)[-1],
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                dir_fd=dfd,
            )
    except FileNotFoundError:
        msg = f"no file at {DATA_MOUNT}/{rel}"
        raise FileNotFound(msg) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            msg = f"{DATA_MOUNT}/{rel} is a symbolic link; refused"
            raise InvalidRequest(msg, param="path") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        msg = f"{DATA_MOUNT}/{rel} is not a regular file"
        raise InvalidRequest(msg, param="path")
    os.set_blocking(fd, True)
    return fd


def read_chunks(fd: int, chunk: int = 1 << 16) -> Iterator[bytes]:
    try:
        while data := os.read(fd, chunk):
            yield data
    finally:
        os.close(fd)


def write_file(
    root: Path, rel: str, chunks: Iterator[bytes], *, uid: int, mode: int = 0o644
) -> int:
    """Write (replacing) ``rel`` owned by ``uid``; returns the size. Atomic via rename."""
    name = rel.rsplit("/", 1)[-1]
    tmp = f"{UPLOAD_PREFIX}{_RUN}-{next(_UPLOAD_SEQ)}"
    with _parent_fd(root, rel, create=True, uid=uid) as dfd:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                msg = f"{DATA_MOUNT}/{rel} is a directory"
                raise InvalidRequest(msg, param="path")
        except FileNotFoundError:
            pass
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dfd,
        )
        size = 0
        try:
            for data in chunks:
                os.write(fd, data)
                size += len(data)
            os.fchown(fd, uid, uid)
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    return size


def delete(root: Path, rel: str) -> None:
    try:
        with _parent_fd(root, rel) as dfd:
            os.unlink(rel.rsplit("/", 1)[-1], dir_fd=dfd)
    except FileNotFoundError:
        msg = f"no file at {DATA_MOUNT}/{rel}"
        raise FileNotFound(msg) from None


def lstat(root: Path, rel: str) -> os.stat_result | None:
    """What is at ``rel`` (a symlink is reported, not followed); None if nothing is."""
    try:
        with _parent_fd(root, rel) as dfd:
            return os.stat(rel.rsplit("/", 1)[-1], dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def stat_file(root: Path, rel: str) -> os.stat_result | None:
    try:
        with _parent_fd(root, rel) as dfd:
            st = os.stat(rel.rsplit("/", 1)[-1], dir_fd=dfd, follow_symlinks=False)
    except (FileNotFoundError, InvalidRequest):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    mtime_ns: int


def scan(root: Path, limit: int = MAX_SCAN_ENTRIES) -> list[Entry]:
    """Regular files under ``root``; see ``scan_counted``."""
    return scan_counted(root, limit)[0]


def scan_counted(root: Path, limit: int = MAX_SCAN_ENTRIES) -> tuple[list[Entry], int]:
    """Regular files under ``root`` (no symlinks followed, hidden upload temps skipped), and
    how many directory entries were looked at (what the scan cost).

    Depth first, one directory open per level: a sandbox with thousands of directories costs
    at most ``MAX_SCAN_DEPTH`` file descriptors, never one per directory. Entries that vanish
    while we look (the sandbox is still running) are skipped.
    """
    out: list[Entry] = []
    try:
        top = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return out, 0
    budget = [limit]
    try:
        _scan_dir(top, "", 0, out, budget)
    finally:
        os.close(top)
    return out, limit - max(budget[0], 0)


def _scan_dir(dfd: int, prefix: str, depth: int, out: list[Entry], budget: list[int]) -> None:
    subdirs: list[str] = []
    with os.scandir(dfd) as it:
        for entry in it:
            budget[0] -= 1
            if budget[0] < 0:
                return
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                if not entry.name.startswith(UPLOAD_PREFIX):
                    out.append(Entry(f"{prefix}{entry.name}", st.st_size, st.st_mtime_ns))
            elif stat.S_ISDIR(st.st_mode) and depth < MAX_SCAN_DEPTH:
                subdirs.append(entry.name)
    for name in subdirs:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            # Gone, or swapped for a symlink or a file since it was listed: skip it. Any other
            # error (out of file descriptors, say) must not silently drop files from the index.
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                continue
            raise
        try:
            _scan_dir(sub, f"{prefix}{name}/", depth + 1, out, budget)
        finally:
            os.close(sub)


def sweep_uploads(root: Path) -> int:
    """Remove the upload temporaries an earlier server process left under ``root`` (a crash
    mid-upload); returns how many. Only files this server's uid owns are touched (the upload
    is handed to the sandbox user only just before its rename), so a sandbox's own file of a
    similar name stays. Walks like ``scan``: no symlinks followed, at most MAX_SCAN_DEPTH."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return 0
    try:
        return _sweep_dir(top, 0, f"{UPLOAD_PREFIX}{_RUN}-", os.getuid())
    finally:
        os.close(top)


def _sweep_dir(dfd: int, depth: int, ours: str, uid: int) -> int:
    removed = 0
    subdirs: list[str] = []
    with os.scandir(dfd) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth < MAX_SCAN_DEPTH:
                    subdirs.append(entry.name)
            elif (
                stat.S_ISREG(st.st_mode)
                and st.st_uid == uid
                and entry.name.startswith(UPLOAD_PREFIX)
                and not entry.name.startswith(ours)
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=dfd)
                    removed += 1
    for name in subdirs:
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES):
                continue
            raise
        try:
            removed += _sweep_dir(sub, depth + 1, ours, uid)
        finally:
            os.close(sub)
    return removed
