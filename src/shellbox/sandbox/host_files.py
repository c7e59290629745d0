"""The files of containers whose data directories are on this host: ``OciRuntime``'s half of
the ``Runtime`` file methods.

Every access goes through the link-refusing ``datafs`` walk from the data directory, so
nothing a client or a sandbox names can lead outside it; what crosses to the caller is bytes
and values, never a path or a descriptor. Blocking work runs in worker threads, but for
listing small trees (a thread hop would cost more than the scan).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread

from shellbox.errors import FileNotFound, InvalidRequest, SandboxError
from shellbox.patch import PatchOperation
from shellbox.sandbox import archive
from shellbox.sandbox import datafs as fs
from shellbox.sandbox.base import ByteSource, CommandResult, ExecRequest, FileInfo, PatchResult
from shellbox.sandbox.patch_files import apply_operations

CHUNK = 1 << 16
# A scan costs about 3 us per directory entry here (2 000 entries: 6 ms). Up to this many it
# runs on the event loop (~1.5 ms at most), beyond it in a worker thread.
INLINE_SCAN_ENTRIES = 500

Run = Callable[[str, ExecRequest], Coroutine[Any, Any, list[CommandResult]]]


class FileStream:
    """An open file's bytes as an async stream; the descriptor is closed at the end, on
    ``aclose``, or when the stream is dropped unread (a response that never started)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __aiter__(self) -> FileStream:
        return self

    async def __anext__(self) -> bytes:
        if self._fd < 0:
            raise StopAsyncIteration
        data = await anyio.to_thread.run_sync(os.read, self._fd, CHUNK)
        if not data:
            self._close()
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self._close()


def _pull(chunks: AsyncIterable[bytes]) -> Iterator[bytes]:
    """Iterate an async byte stream from a worker thread started by ``anyio.to_thread``."""
    it = aiter(chunks)

    async def next_chunk() -> bytes | None:
        try:
            return await anext(it)
        except StopAsyncIteration:
            return None

    while (data := anyio.from_thread.run(next_chunk)) is not None:
        if data:
            yield data


def sync_chunks(chunks: ByteSource) -> Iterator[bytes]:
    """The body as a plain iterator, for the worker thread that writes it."""
    if isinstance(chunks, AsyncIterable):
        return _pull(chunks)
    return iter(chunks)


class HostFiles:
    """File access to containers' ``/mnt/data`` on this host.

    ``data_dir`` gives a container's data directory, ``sandbox_uid`` the host uid of its
    sandbox user (who owns what is written), ``run`` runs commands in it (the archives)."""

    def __init__(
        self,
        data_dir: Callable[[str], Path],
        sandbox_uid: Callable[[str], int],
        run: Run,
    ) -> None:
        self.data_dir = data_dir
        self.sandbox_uid = sandbox_uid
        self.run = run
        self._scan_cost: dict[str, int] = {}  # container -> entries its last scan looked at

    def forget(self, container_id: str) -> None:
        self._scan_cost.pop(container_id, None)

    async def read_file(
        self, container_id: str, rel: str, *, follow_links: bool = False, param: str = "path"
    ) -> AsyncIterator[bytes]:
        root = self.data_dir(container_id)

        def open_file() -> int:
            target = fs.resolve(root, rel, param=param) if follow_links else rel
            return fs.open_read(root, target, param=param)

        return FileStream(await anyio.to_thread.run_sync(open_file))

    async def write_file(
        self,
        container_id: str,
        rel: str,
        chunks: ByteSource,
        *,
        follow_links: bool = False,
        param: str = "path",
    ) -> tuple[str, int]:
        root = self.data_dir(container_id)
        uid = self.sandbox_uid(container_id)

        def write() -> tuple[str, int]:
            target = fs.resolve(root, rel, param=param) if follow_links else rel
            return target, fs.write_file(root, target, sync_chunks(chunks), uid=uid, param=param)

        return await anyio.to_thread.run_sync(write)

    async def stat_file(self, container_id: str, rel: str) -> FileInfo | None:
        st = fs.stat_file(self.data_dir(container_id), rel)  # one walk: on the loop
        return None if st is None else FileInfo(rel, st.st_size, st.st_mtime_ns)

    async def list_files(self, container_id: str) -> list[FileInfo]:
        """Small trees are scanned right on the event loop (a thread hop would cost more than
        the scan); a container whose last scan looked at more than ``INLINE_SCAN_ENTRIES``
        entries is scanned in a worker thread, so a sandbox with a huge tree cannot stall
        every other request."""
        root = self.data_dir(container_id)
        if self._scan_cost.get(container_id, 0) > INLINE_SCAN_ENTRIES:
            found, cost = await anyio.to_thread.run_sync(fs.scan_counted, root)
        else:
            found, cost = fs.scan_counted(root)
        self._scan_cost[container_id] = cost
        return found

    async def remove_file(self, container_id: str, rel: str, *, param: str = "path") -> None:
        root = self.data_dir(container_id)
        await anyio.to_thread.run_sync(lambda: fs.delete(root, rel, param=param))

    async def resolve_path(self, container_id: str, rel: str, *, param: str = "path") -> str:
        root = self.data_dir(container_id)
        # In a worker thread: links the sandbox made may make it walk thousands of
        # directories, which must not stall the event loop.
        return await anyio.to_thread.run_sync(
            lambda: fs.resolve(root, rel, param=param, allow_root=True)
        )

    async def apply_patch(
        self, container_id: str, operations: Sequence[PatchOperation]
    ) -> PatchResult:
        root, uid = self.data_dir(container_id), self.sandbox_uid(container_id)
        completed, output = await anyio.to_thread.run_sync(apply_operations, root, uid, operations)
        return PatchResult(completed, output)

    async def sweep_uploads(self, container_id: str) -> int:
        return await anyio.to_thread.run_sync(fs.sweep_uploads, self.data_dir(container_id))

    # -- archives ---------------------------------------------------------------------------

    async def export_archive(
        self, container_id: str, rel_dir: str, exclude: Sequence[str], *, timeout_ms: int
    ) -> AsyncIterator[bytes]:
        root = self.data_dir(container_id)
        tmp = archive.temp_name("export")
        command = archive.export_command(rel_dir, tmp, exclude)
        # Exporting must not change the tree: SDK sandboxes fingerprint the workspace (with
        # the directory times tar records) to decide whether a resumed container still holds
        # what was persisted, and the temporary archive's create and delete move /mnt/data's
        # mtime. Put it back. (root is the host's directory, never a sandbox-made symlink.)
        before = os.stat(root)
        try:
            result = await self._run_one(container_id, command, timeout_ms)
            archive.check_tar(result, rel_dir, creating=True)
            fd = fs.open_read(root, tmp)
        finally:
            with contextlib.suppress(FileNotFound, InvalidRequest, OSError):
                fs.delete(root, tmp)  # an open fd keeps the data readable until it is closed
            with contextlib.suppress(OSError):
                os.utime(root, ns=(before.st_atime_ns, before.st_mtime_ns))
        return FileStream(fd)

    async def import_archive(
        self, container_id: str, rel_dir: str, body: ByteSource, *, timeout_ms: int
    ) -> int:
        root = self.data_dir(container_id)
        tmp = archive.temp_name("import")
        try:
            _, size = await self.write_file(container_id, tmp, body)
            result = await self._run_one(
                container_id, archive.import_command(rel_dir, tmp), timeout_ms
            )
        finally:
            with contextlib.suppress(FileNotFound, InvalidRequest, OSError):
                fs.delete(root, tmp)
        archive.check_tar(result, rel_dir, creating=False)
        return size

    async def _run_one(self, container_id: str, command: str, timeout_ms: int) -> CommandResult:
        request = ExecRequest(
            commands=[command],
            timeout_ms=timeout_ms,
            max_output_length=archive.TAR_MESSAGE_CHARS,
            stream=False,
        )
        results = await self.run(container_id, request)
        if not results:
            msg = f"the sandbox of container {container_id} returned no result for tar"
            raise SandboxError(msg)
        return results[0]
