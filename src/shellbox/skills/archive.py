"""A skill's unpacked files as a tar stream: how a skill crosses to the runtime, by value.

Made lazily, one member at a time, so that a runtime that already holds the skill never
makes it read a byte (``Runtime.install_skill`` does not iterate it then), and a large one
is never whole in memory.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 16


class _Buffer:
    """The file object ``tarfile`` writes to: it collects what was written since the last
    ``take``."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


def tar_chunks(root: Path) -> Iterator[bytes]:
    """A tar of the tree under ``root`` (members ``./...``; regular files, folders and links
    as they are, owners left out), in chunks."""
    buf = _Buffer()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in [*sorted(dirnames), *sorted(filenames)]:
                path = Path(dirpath) / name
                info = tar.gettarinfo(str(path), arcname=f"./{path.relative_to(root)}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
                if len(buf.parts) and sum(map(len, buf.parts)) >= CHUNK:
                    yield buf.take()
    rest = buf.take()
    if rest:
        yield rest
