"""A container's ``/mnt/data`` addressed by path, for SDK sandbox providers: read and write one
file, and move the whole tree (or a directory of it) in and out as a tar stream.

Files are read and written on the host through the symlink-proof ``fs`` helpers. A symbolic
link on a file's path is followed as the container would follow it while it stays inside
/mnt/data (what an SDK sandbox expects of a workspace), and refused with
``path_outside_workspace`` when it leads out. Archives are
never built or unpacked on the host: ``tar`` runs inside the container as the sandbox user, on
a temporary file in ``/mnt/data`` that the host writes or reads with the same helpers. A
hostile archive (absolute names, ``..``, symlinks pointing out) can therefore only do what
the sandbox user can already do inside its own container.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import PurePosixPath

import anyio
import anyio.from_thread

from shellbox.errors import (
    Conflict,
    ContainerNotRunning,
    FileNotFound,
    InvalidRequest,
    PayloadTooLarge,
    SandboxError,
)
from shellbox.ids import new_id
from shellbox.sandbox.base import CommandFinished, CommandResult, ExecRequest
from shellbox.sandbox.oci import SANDBOX_UID
from shellbox.service import fs
from shellbox.service.containers import LIVE, ContainerService
from shellbox.service.models import ContainerRecord, Principal
from shellbox.service.shell import ShellLimits

# fs.scan skips names with this prefix, so temporary archives never show up as container files
# (must match the prefix in service/fs.py).
TEMP_PREFIX = ".shellbox-upload-"
MAX_EXCLUDES = 1000
TAR_MESSAGE_CHARS = 2000
EXIT_NO_DIRECTORY = 3


def data_dir_path(path: str | None) -> str:
    """``path`` (a directory) relative to /mnt/data; ``""`` is /mnt/data itself."""
    if path is None or path.strip("/") in ("", ".", fs.DATA_MOUNT.strip("/")):
        return ""
    return fs.relative_path(path, param="path")


def exclude_pattern(entry: str) -> str:
    """A tar member name (``./a/b``) for one path to leave out, relative to the directory."""
    p = PurePosixPath(entry)
    parts = [part for part in p.parts if part not in ("", ".")]
    if not entry or "\x00" in entry or p.is_absolute() or ".." in parts or not parts:
        msg = f"exclude entry {entry!r} must be a non-empty path relative to the directory"
        raise InvalidRequest(msg, param="exclude")
    return "./" + "/".join(parts)


def _capped(chunks: Iterator[bytes], cap: int) -> Iterator[bytes]:
    total = 0
    for data in chunks:
        total += len(data)
        if total > cap:
            msg = f"the body is larger than the {cap} byte limit of this server"
            raise PayloadTooLarge(msg, param="body")
        yield data


def _pull(chunks: AsyncIterator[bytes]) -> Iterator[bytes]:
    """Iterate an async byte stream from a worker thread started by ``anyio.to_thread``."""

    async def next_chunk() -> bytes | None:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            return None

    while (data := anyio.from_thread.run(next_chunk)) is not None:
        if data:
            yield data


def _limited(chunks: Iterator[bytes], max_bytes: int | None) -> Iterator[bytes]:
    if max_bytes is None:
        yield from chunks
        return
    left = max_bytes
    try:
        for data in chunks:
            if left <= 0:
                break
            yield data[:left]
            left -= len(data)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class WorkspaceService:
    def __init__(
        self, containers: ContainerService, limits: ShellLimits, upload_max_bytes: int
    ) -> None:
        self.containers = containers
        self.limits = limits
        self.upload_max_bytes = upload_max_bytes

    def _live(self, principal: Principal, cid: str) -> ContainerRecord:
        record = self.containers.get(principal, cid)
        if record.status not in LIVE:
            msg = f"container {cid} has {record.status}; its files are gone"
            raise ContainerNotRunning(msg, param="container_id")
        return record

    # -- single files -----------------------------------------------------------------------

    async def read(
        self, principal: Principal, cid: str, path: str, max_bytes: int | None = None
    ) -> Iterator[bytes]:
        self._live(principal, cid)
        root = self.containers.data_dir(cid)
        rel = fs.relative_path(path)

        def open_file() -> int:
            return fs.open_read(root, fs.resolve(root, rel))

        fd = await anyio.to_thread.run_sync(open_file)
        self.containers.touch(cid)
        return _limited(fs.read_chunks(fd), max_bytes)

    async def resolve(self, principal: Principal, cid: str, path: str) -> str:
        """Where ``path`` leads with its symbolic links followed (absolute, in the container);
        PathOutsideWorkspace if a link on it leads out of /mnt/data."""
        self._live(principal, cid)
        root, rel = self.containers.data_dir(cid), fs.relative_path(path)
        # In a worker thread, like every resolve: links the sandbox made may make it walk
        # thousands of directories, which must not stall the event loop.
        resolved = await anyio.to_thread.run_sync(lambda: fs.resolve(root, rel, allow_root=True))
        return _absolute(resolved)

    async def write(
        self, principal: Principal, cid: str, path: str, body: AsyncIterator[bytes]
    ) -> tuple[str, int]:
        """Replace (or create, with parent directories) one file; returns (path, size)."""
        self._live(principal, cid)
        root = self.containers.data_dir(cid)
        rel = await anyio.to_thread.run_sync(fs.resolve, root, fs.relative_path(path))
        size = await self._receive(cid, rel, body)
        self.containers.touch(cid)
        return f"{fs.DATA_MOUNT}/{rel}", size

    async def _receive(self, cid: str, rel: str, body: AsyncIterator[bytes]) -> int:
        root = self.containers.data_dir(cid)
        cap = self.upload_max_bytes
        uid = self.containers.host_uid(cid, SANDBOX_UID)

        def write() -> int:
            chunks = _capped(_pull(body), cap)
            return fs.write_file(root, rel, chunks, uid=uid)

        return await anyio.to_thread.run_sync(write)

    # -- archives ---------------------------------------------------------------------------

    async def export_archive(
        self, principal: Principal, cid: str, path: str | None, exclude: Sequence[str]
    ) -> Iterator[bytes]:
        """A tar of the directory (members ``./...``); temporary files are left out."""
        if len(exclude) > MAX_EXCLUDES:
            msg = f"{len(exclude)} exclude entries; at most {MAX_EXCLUDES} are allowed"
            raise InvalidRequest(msg, param="exclude")
        patterns = [exclude_pattern(e) for e in exclude]
        rel_dir = data_dir_path(path)
        self._live(principal, cid)
        tmp = f"{TEMP_PREFIX}export-{new_id('', 8)}.tar"
        command = " ".join(
            [
                f"cd -- {shlex.quote(_absolute(rel_dir))} || exit {EXIT_NO_DIRECTORY};",
                f"exec tar --create --file={shlex.quote(_absolute(tmp))}",
                f"--wildcards --exclude={shlex.quote('./' + TEMP_PREFIX + '*')}",
                "--no-wildcards --anchored",
                *(f"--exclude={shlex.quote(p)}" for p in patterns),
                ".",
            ]
        )
        root = self.containers.data_dir(cid)
        # Exporting must not change the tree: SDK sandboxes fingerprint the workspace (with
        # the directory times tar records) to decide whether a resumed container still holds
        # what was persisted, and the temporary archive's create and delete move /mnt/data's
        # mtime. Put it back. (root is the host's directory, never a sandbox-made symlink.)
        before = os.stat(root)
        try:
            result = await self._run(principal, cid, command)
            _check_tar(result, rel_dir, creating=True)
            fd = fs.open_read(root, tmp)
        finally:
            with contextlib.suppress(FileNotFound, InvalidRequest, OSError):
                fs.delete(root, tmp)  # an open fd keeps the data readable until it is closed
            with contextlib.suppress(OSError):
                os.utime(root, ns=(before.st_atime_ns, before.st_mtime_ns))
        return fs.read_chunks(fd)

    async def import_archive(
        self, principal: Principal, cid: str, path: str | None, body: AsyncIterator[bytes]
    ) -> tuple[str, int]:
        """Unpack a tar under the directory (created if missing); returns (dir, tar size)."""
        rel_dir = data_dir_path(path)
        self._live(principal, cid)
        tmp = f"{TEMP_PREFIX}import-{new_id('', 8)}.tar"
        root = self.containers.data_dir(cid)
        target = shlex.quote(_absolute(rel_dir))
        command = (
            f"mkdir -p -- {target} && exec tar --extract --file={shlex.quote(_absolute(tmp))}"
            f" --directory={target} --no-same-owner --no-overwrite-dir"
        )
        try:
            size = await self._receive(cid, tmp, body)
            result = await self._run(principal, cid, command)
        finally:
            with contextlib.suppress(FileNotFound, InvalidRequest, OSError):
                fs.delete(root, tmp)
        _check_tar(result, rel_dir, creating=False)
        return _absolute(rel_dir), size

    async def _run(self, principal: Principal, cid: str, command: str) -> CommandResult:
        request = ExecRequest(
            commands=[command],
            timeout_ms=self.limits.max_timeout_ms,
            max_output_length=TAR_MESSAGE_CHARS,
            stream=False,
        )
        results: list[CommandResult] = []
        async with self.containers.activity(principal, cid):
            async for event in self.containers.runtime.exec(cid, request):
                if isinstance(event, CommandFinished):
                    results.append(event.result)
        if not results:
            msg = f"the sandbox of container {cid} returned no result for tar"
            raise SandboxError(msg)
        return results[0]


def _absolute(rel: str) -> str:
    return f"{fs.DATA_MOUNT}/{rel}" if rel else fs.DATA_MOUNT


def _check_tar(result: CommandResult, rel_dir: str, *, creating: bool) -> None:
    where = _absolute(rel_dir)
    if result.outcome.type == "timeout":
        msg = f"tar did not finish within the command timeout for {where}"
        raise Conflict(msg, param="path")
    code = result.outcome.exit_code
    # GNU tar: 1 means "some files changed while being read", the archive is still usable.
    if code == 0 or (creating and code == 1):
        return
    if code == EXIT_NO_DIRECTORY:
        msg = f"no directory at {where}"
        raise FileNotFound(msg, param="path")
    detail = result.stderr.strip() or f"exit code {code}"
    if creating:
        msg = f"could not archive {where}: {detail}"
        raise Conflict(msg, param="path")
    msg = f"could not unpack the archive into {where}: {detail}"
    raise InvalidRequest(msg, param="body")
