"""Host-side access to a container's ``/mnt/data`` that nothing from a client or a sandbox can
steer outside it.

The sandbox controls everything under its data directory, including symlinks that point at
host paths (``/etc/shadow``) or into another container's tree. So every path is opened one
component at a time from a directory file descriptor with ``O_NOFOLLOW``: a symlink anywhere
on the way is refused, and a directory swapped for a symlink mid-walk cannot redirect us.
Where links must be followed (the workspace endpoints, as an SDK sandbox expects), ``resolve``
follows them as the container would, only while they stay inside, and its answer is then
opened with the same refusing walk.

Every error a client's path can cause is an InvalidRequest naming the request's field.

This is the OCI runtime's side of the seam: only ``OciRuntime`` (``crun.py``) calls it, with the
data directory it owns; the service layer reaches files through ``Runtime`` methods.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from shellbox.errors import DiskQuotaExceeded, FileNotFound, InvalidRequest, PathOutsideWorkspace
from shellbox.sandbox.base import FileInfo
from shellbox.sandbox.datapath import DATA_MOUNT, NAME_MAX, check_name_limits
from shellbox.sandbox.datapath import relative_path as relative_path  # re-exported

MAX_SCAN_ENTRIES = 20_000
MAX_SCAN_DEPTH = 64
MAX_SYMLINKS = 40  # links followed while resolving one path (Linux's own limit)
MAX_RESOLVE_STEPS = 4096  # directories opened to resolve one path: ~85 ms for a crafted tree
# An upload is written to ``.shellbox-upload-<run>-<n>`` next to its target, then renamed. The
# run token tells this process's temporaries (in flight) from those a crashed one left.
UPLOAD_PREFIX = ".shellbox-upload-"
_RUN = secrets.token_hex(6)
_UPLOAD_SEQ = itertools.count()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# What a client's path can make the kernel answer; each is the client's to fix, never a 500.
_PATH_ERRNOS = {
    errno.ELOOP: "is or goes through a symbolic link; refused",
    # O_DIRECTORY|O_NOFOLLOW answers ENOTDIR for a symlink on the way, not ELOOP.
    errno.ENOTDIR: "goes through a symbolic link or something that is not a directory; refused",
    errno.EISDIR: "is a directory, or became one while it was being written",
    errno.EEXIST: "changed inside the container while it was being written; try again",
    errno.ENOTEMPTY: "changed inside the container while it was being written; try again",
    errno.ENAMETOOLONG: f"has a name over {NAME_MAX} bytes or is too long as a whole",
    errno.EILSEQ: "is not a name this file system accepts",
    errno.EINVAL: "is not a name this file system accepts",
}


def path_error(exc: OSError, rel: str, param: str) -> InvalidRequest | None:
    """The client error for an OSError from a client's path; None for anything else."""
    reason = _PATH_ERRNOS.get(exc.errno or 0)
    if reason is None:
        return None
    return InvalidRequest(f"{_shown(rel)} {reason}", param=param)


def raise_path_error(exc: OSError, rel: str, param: str) -> NoReturn:
    """Raise the client error ``path_error`` finds for ``exc``, or ``exc`` itself."""
    mapped = path_error(exc, rel, param)
    if mapped is None:
        raise exc
    raise mapped from None


def _shown(rel: str) -> str:
    """``rel`` as messages show it: absolute, and cut short when it is very long."""
    where = f"{DATA_MOUNT}/{rel}"
    return where if len(where) <= 200 else f"{where[:200]}..."


@contextlib.contextmanager
def _parent_fd(root: Path, rel: str, *, param: str = "path") -> Iterator[int]:
    """Yield an fd of the directory holding ``rel``'s last component, walked without symlinks.

    An OSError that the path explains (a link or a file on the way, a name the file system
    refuses), raised here or in the caller's block, becomes an InvalidRequest naming ``param``.
    """
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in rel.split("/")[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise_path_error(exc, rel, param)
    finally:
        os.close(fd)


def resolve(root: Path, rel: str, *, param: str = "path", allow_root: bool = False) -> str:
    """``rel`` with each symbolic link on it followed the way a process in the container
    would follow it, as long as every one stays inside /mnt/data: the result has no links
    left on it (what is missing at its end is returned as named, for a write to create).

    A link that leads out (to ``/etc/passwd``, ``../..``, another mount) raises
    PathOutsideWorkspace. A path that leads back to /mnt/data itself is ``""`` with
    ``allow_root``, a client error otherwise (it is not a file). The answer is only a name:
    the caller then opens it with the link-refusing walk, so a link planted after this check
    is refused, never followed.
    """
    walk = _Walk(root, param, rel)
    todo = rel.split("/")[::-1]  # components still to walk, next one last
    hops = 0
    try:
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not walk.done:
                    raise _outside(rel, param)
                walk.up()
                continue
            try:
                st = os.stat(part, dir_fd=walk.fd(), follow_symlinks=False)
            except FileNotFoundError:
                rest = [p for p in reversed(todo) if p not in ("", ".")]
                if ".." in rest:
                    msg = f"no directory at {DATA_MOUNT}/{'/'.join([*walk.done, part])}"
                    raise FileNotFound(msg, param=param) from None
                return "/".join([*walk.done, part, *rest])
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINKS:
                    msg = f"{DATA_MOUNT}/{rel} goes through more than {MAX_SYMLINKS} links"
                    raise InvalidRequest(msg, param=param)
                target = os.readlink(part, dir_fd=walk.fd())
                if target.startswith("/"):
                    inside = _inside_mount(target)
                    if inside is None:
                        raise _outside(rel, param)
                    walk.to_root()
                    target = inside
                todo.extend(target.split("/")[::-1])
                continue
            if any(p not in ("", ".") for p in todo):
                if not stat.S_ISDIR(st.st_mode):
                    msg = f"{DATA_MOUNT}/{'/'.join([*walk.done, part])} is not a directory"
                    raise InvalidRequest(msg, param=param)
                walk.down(part)
            else:
                walk.done.append(part)
        if not walk.done and allow_root:
            return ""
        if not walk.done:
            msg = f"{DATA_MOUNT}/{rel} leads to the data directory itself, not a file"
            raise InvalidRequest(msg, param=param)
        resolved = "/".join(walk.done)
        check_name_limits(resolved, shown=rel, param=param)
        return resolved
    except OSError as exc:
        raise_path_error(exc, rel, param)
    finally:
        walk.close()


class _Walk:
    """Where ``resolve`` is: the directories walked (``done``) and one fd of the last, opened
    again from the root (lazily) after a ``..``. One directory is open at a time whatever the
    depth, and every open counts against MAX_RESOLVE_STEPS, so links the sandbox made cannot
    make one request hold many descriptors or do unbounded work."""

    def __init__(self, root: Path, param: str, rel: str) -> None:
        self.root = root
        self.param = param
        self.rel = rel
        self.done: list[str] = []
        self.steps = 0
        self._fd: int | None = None

    def _open(self, name: str | Path, dir_fd: int | None) -> int:
        self.steps += 1
        if self.steps > MAX_RESOLVE_STEPS:
            msg = f"{DATA_MOUNT}/{self.rel} takes too many steps to resolve (links on links?)"
            raise InvalidRequest(msg, param=self.param)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)

    def fd(self) -> int:
        if self._fd is None:
            fd = self._open(self.root, None)
            try:
                for part in self.done:
                    nxt = self._open(part, fd)
                    os.close(fd)
                    fd = nxt
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def down(self, part: str) -> None:
        nxt = self._open(part, self.fd())
        self.close()
        self._fd = nxt
        self.done.append(part)

    def up(self) -> None:
        self.done.pop()
        self.close()

    def to_root(self) -> None:
        self.done.clear()
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _inside_mount(target: str) -> str | None:
    """An absolute link target as a path relative to /mnt/data, or None if it is not under
    it (spelled with ``..`` or ``//`` too: refused rather than guessed)."""
    prefix = DATA_MOUNT + "/"
    if target.rstrip("/") == DATA_MOUNT:
        return ""
    if not target.startswith(prefix):
        return None
    return target[len(prefix) :]


def _outside(rel: str, param: str) -> PathOutsideWorkspace:
    msg = f"{_shown(rel)} is or goes through a symbolic link that leads outside {DATA_MOUNT}"
    return PathOutsideWorkspace(msg, param=param)


def open_read(root: Path, rel: str, *, param: str = "path") -> int:
    """An fd for reading the regular file ``rel``; symlinks and special files are refused."""
    try:
        with _parent_fd(root, rel, param=param) as dfd:
            fd = os.open(
                rel.rsplit("/", 1)[-1],
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                dir_fd=dfd,
            )
    except FileNotFoundError:
        msg = f"no file at {DATA_MOUNT}/{rel}"
        raise FileNotFound(msg, param=param) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        msg = f"{DATA_MOUNT}/{rel} is not a regular file"
        raise InvalidRequest(msg, param=param)
    os.set_blocking(fd, True)
    return fd


def read_chunks(fd: int, chunk: int = 1 << 16) -> Iterator[bytes]:
    try:
        while data := os.read(fd, chunk):
            yield data
    finally:
        os.close(fd)


def write_file(
    root: Path,
    rel: str,
    chunks: Iterator[bytes],
    *,
    uid: int,
    mode: int = 0o644,
    param: str = "path",
) -> int:
    """Write (replacing) ``rel`` owned by ``uid``, making missing parent directories; returns
    the size. Atomic via rename.

    The bytes go to a temporary file in the deepest directory that already exists, and the
    missing directories are made only once every byte has arrived: a body that fails (too
    large, cut off, past the container's disk quota) or a name the file system refuses leaves
    nothing behind. Past the quota: ``DiskQuotaExceeded`` (413).
    """
    parts = rel.split("/")
    name = parts[-1]
    tmp = f"{UPLOAD_PREFIX}{_RUN}-{next(_UPLOAD_SEQ)}"
    base = os.open(root, _DIR_FLAGS)  # one directory open at a time, however deep the path
    try:
        depth = 0
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=base)
            except FileNotFoundError:
                break
            os.close(base)
            base = nxt
            depth += 1
        missing = parts[depth:-1]
        if not missing:
            _refuse_directory(base, name, rel, param)
        size = _write_temp(base, tmp, chunks, uid, mode)
        made: list[int] = []
        try:
            target = _make_dirs(base, missing, uid, made)
            try:
                os.rename(tmp, name, src_dir_fd=base, dst_dir_fd=target)
            finally:
                if target != base:
                    os.close(target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=base)
            _remove_dirs(base, missing, made)
            raise
        return size
    except (FileNotFoundError, InvalidRequest):
        raise
    except OSError as exc:
        # The temporary file's bytes, a directory made or the rename's new entry: any of them
        # can be what no longer fits.
        if exc.errno in (errno.EDQUOT, errno.ENOSPC):
            msg = (
                f"{_shown(rel)} does not fit: {os.strerror(exc.errno)} (the container's disk "
                "quota, limits.disk_gb, is used up); delete files in the container, then try "
                "again"
            )
            raise DiskQuotaExceeded(msg, param=param) from None
        raise_path_error(exc, rel, param)
    finally:
        os.close(base)


def _refuse_directory(dfd: int, name: str, rel: str, param: str) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        msg = f"{DATA_MOUNT}/{rel} is a directory"
        raise InvalidRequest(msg, param=param)


def _write_temp(dfd: int, tmp: str, chunks: Iterator[bytes], uid: int, mode: int) -> int:
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
    )
    size = 0
    try:
        try:
            for data in chunks:
                view = memoryview(data)
                while view:  # a write is short when the disk fills; the next one fails
                    view = view[os.write(fd, view) :]
                size += len(data)
            os.fchown(fd, uid, uid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # the sandbox may have removed it
            os.unlink(tmp, dir_fd=dfd)
        raise
    return size


def _make_dirs(base: int, names: list[str], uid: int, made: list[int]) -> int:
    """Make ``names`` as a chain under ``base``; returns an fd of the last (``base`` itself
    for none). ``made`` gets the indexes of the ones this call created, for ``_remove_dirs``."""
    fd = base
    try:
        for i, part in enumerate(names):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                made.append(i)
            except FileExistsError:  # the sandbox made it meanwhile: use theirs
                pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != base:
                os.close(fd)
            fd = nxt
            if made and made[-1] == i:
                os.fchown(fd, uid, uid)
    except BaseException:
        if fd != base:
            os.close(fd)
        raise
    return fd


def _remove_dirs(base: int, names: list[str], made: list[int]) -> None:
    """Remove the directories ``_make_dirs`` created, deepest first, after a failure; one the
    sandbox has put something in meanwhile stays (and so do those above it)."""
    for i in reversed(made):
        fd = base
        try:
            for part in names[:i]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if fd != base:
                    os.close(fd)
                fd = nxt
            os.rmdir(names[i], dir_fd=fd)
        except OSError:
            return
        finally:
            if fd != base:
                os.close(fd)


def delete(root: Path, rel: str, *, param: str = "path") -> None:
    try:
        with _parent_fd(root, rel, param=param) as dfd:
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


Entry = FileInfo  # a regular file found by ``scan``


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
