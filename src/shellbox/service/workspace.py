"""A container's ``/mnt/data`` addressed by path, for SDK sandbox providers: read and write one
file, and move the whole tree (or a directory of it) in and out as a tar stream.

Files are the runtime's (``Runtime.read_file`` and friends, which refuse anything leading out
of /mnt/data). A symbolic link on a file's path is followed as the container would follow it
while it stays inside /mnt/data (what an SDK sandbox expects of a workspace), and refused
with ``path_outside_workspace`` when it leads out. Archives are made and unpacked inside the
container by the sandbox user (``sandbox/archive.py``), never on the host.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import PurePosixPath

from shellbox.errors import ContainerNotRunning, InvalidRequest, PayloadTooLarge
from shellbox.sandbox.datapath import DATA_MOUNT, relative_path
from shellbox.service.containers import LIVE, ContainerService
from shellbox.service.models import ContainerRecord, Principal
from shellbox.service.shell import ShellLimits

MAX_EXCLUDES = 1000


def data_dir_path(path: str | None) -> str:
    """``path`` (a directory) relative to /mnt/data; ``""`` is /mnt/data itself."""
    if path is None or path.strip("/") in ("", ".", DATA_MOUNT.strip("/")):
        return ""
    return relative_path(path, param="path")


def exclude_pattern(entry: str) -> str:
    """A tar member name (``./a/b``) for one path to leave out, relative to the directory."""
    p = PurePosixPath(entry)
    parts = [part for part in p.parts if part not in ("", ".")]
    if not entry or "\x00" in entry or p.is_absolute() or ".." in parts or not parts:
        msg = f"exclude entry {entry!r} must be a non-empty path relative to the directory"
        raise InvalidRequest(msg, param="exclude")
    return "./" + "/".join(parts)


async def _capped(chunks: AsyncIterator[bytes], cap: int) -> AsyncIterator[bytes]:
    total = 0
    async for data in chunks:
        total += len(data)
        if total > cap:
            msg = f"the body is larger than the {cap} byte limit of this server"
            raise PayloadTooLarge(msg, param="body")
        yield data


async def _limited(chunks: AsyncIterator[bytes], max_bytes: int | None) -> AsyncIterator[bytes]:
    left = max_bytes
    try:
        async for data in chunks:
            if left is None:
                yield data
                continue
            if left <= 0:
                break
            yield data[:left]
            left -= len(data)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


class WorkspaceService:
    def __init__(
        self, containers: ContainerService, limits: ShellLimits, upload_max_bytes: int
    ) -> None:
        self.containers = containers
        self.runtime = containers.runtime
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
    ) -> AsyncIterator[bytes]:
        self._live(principal, cid)
        chunks = await self.runtime.read_file(cid, relative_path(path), follow_links=True)
        self.containers.touch(cid)
        return chunks if max_bytes is None else _limited(chunks, max_bytes)

    async def resolve(self, principal: Principal, cid: str, path: str) -> str:
        """Where ``path`` leads with its symbolic links followed (absolute, in the container);
        PathOutsideWorkspace if a link on it leads out of /mnt/data."""
        self._live(principal, cid)
        return _absolute(await self.runtime.resolve_path(cid, relative_path(path)))

    async def write(
        self, principal: Principal, cid: str, path: str, body: AsyncIterator[bytes]
    ) -> tuple[str, int]:
        """Replace (or create, with parent directories) one file; returns (path, size)."""
        self._live(principal, cid)
        capped = _capped(body, self.upload_max_bytes)
        rel, size = await self.runtime.write_file(
            cid, relative_path(path), capped, follow_links=True
        )
        self.containers.touch(cid)
        return f"{DATA_MOUNT}/{rel}", size

    # -- archives ---------------------------------------------------------------------------

    async def export_archive(
        self, principal: Principal, cid: str, path: str | None, exclude: Sequence[str]
    ) -> AsyncIterator[bytes]:
        """A tar of the directory (members ``./...``); temporary files are left out."""
        if len(exclude) > MAX_EXCLUDES:
            msg = f"{len(exclude)} exclude entries; at most {MAX_EXCLUDES} are allowed"
            raise InvalidRequest(msg, param="exclude")
        patterns = [exclude_pattern(e) for e in exclude]
        rel_dir = data_dir_path(path)
        self._live(principal, cid)
        async with self.containers.activity(principal, cid):
            return await self.runtime.export_archive(
                cid, rel_dir, patterns, timeout_ms=self.limits.max_timeout_ms
            )

    async def import_archive(
        self, principal: Principal, cid: str, path: str | None, body: AsyncIterator[bytes]
    ) -> tuple[str, int]:
        """Unpack a tar under the directory (created if missing); returns (dir, tar size)."""
        rel_dir = data_dir_path(path)
        self._live(principal, cid)
        capped = _capped(body, self.upload_max_bytes)
        async with self.containers.activity(principal, cid):
            size = await self.runtime.import_archive(
                cid, rel_dir, capped, timeout_ms=self.limits.max_timeout_ms
            )
        return _absolute(rel_dir), size


def _absolute(rel: str) -> str:
    return f"{DATA_MOUNT}/{rel}" if rel else DATA_MOUNT
