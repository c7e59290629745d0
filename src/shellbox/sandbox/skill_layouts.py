"""The skills a runtime holds on its own disk, by key, for containers to mount read-only.

    <state>/skill-layouts/
      .staging/<tmp>/        an archive being unpacked; renamed into place when whole
      <key>/                 one skill's files (root's: folders 0755, files 0644 or 0755)

The service layer hands a skill over by value (``Runtime.install_skill``: a tar of its files,
content-addressed by its key) and names it in a ``ContainerSpec`` by key; only this module
knows where it lies. Keys are ours (``<skill id>.<version>``, ``inline.<container>.<name>``),
but a path component is never taken on trust, nor is an archive: it is unpacked with
``tarfile``'s ``data`` filter (no absolute names, no ``..``, no links out, no devices, no
owners) and bounded in bytes and members.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from shellbox.errors import InvalidRequest, PayloadTooLarge

KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
STAGING = ".staging"
# What one skill may hold (a bundle is at most 50 MiB zipped and a few hundred files: these
# bound what a caller can make the runtime write, not what a valid skill needs).
MAX_ARCHIVE_BYTES = 1 << 30
MAX_MEMBERS = 20_000


def check_key(key: str) -> str:
    if not KEY.fullmatch(key) or ".." in key:
        msg = f"not a valid skill key: {key[:80]!r}"
        raise InvalidRequest(msg, param="key")
    return key


class SkillLayouts:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root / STAGING
        for d in (root, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        # The container's root (an unprivileged host uid) traverses to bind-mount; nobody lists.
        os.chmod(root, 0o711)
        os.chmod(self.staging, 0o700)

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def has(self, key: str) -> bool:
        return self.path(key).is_dir()

    def keys(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.name != STAGING and p.is_dir())

    def remove(self, key: str) -> None:
        shutil.rmtree(self.path(key), ignore_errors=True)

    def clear_staging(self) -> None:
        for leftover in self.staging.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)

    def install(self, key: str, chunks: Iterator[bytes]) -> bool:
        """Unpack a tar read from ``chunks`` as ``key`` (blocking: run in a worker thread).
        Returns False, reading nothing, when the key is already held."""
        target = self.path(key)
        if target.is_dir():
            return False
        work = Path(tempfile.mkdtemp(dir=self.staging))
        try:
            archive = work / "archive.tar"
            with open(archive, "wb") as f:
                _spool(chunks, f)
            tree = work / "tree"
            tree.mkdir()
            with tarfile.open(archive, "r:") as tar:
                members = []
                for i, member in enumerate(tar):
                    if i >= MAX_MEMBERS:
                        msg = f"skill {key}: its archive has more than {MAX_MEMBERS} members"
                        raise InvalidRequest(msg, param="archive")
                    members.append(member)
                try:
                    tar.extractall(tree, members=members, filter="data")
                except tarfile.FilterError as exc:
                    msg = f"skill {key}: its archive holds a member it may not: {exc}"
                    raise InvalidRequest(msg, param="archive") from None
            _normalise(tree)
            try:
                os.rename(tree, target)
            except OSError:
                if not target.is_dir():  # not a concurrent install of the same key
                    raise
                return False
            return True
        except tarfile.TarError as exc:
            msg = f"skill {key}: its archive is not a valid tar: {exc}"
            raise InvalidRequest(msg, param="archive") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _spool(chunks: Iterator[bytes], out: IO[bytes]) -> None:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > MAX_ARCHIVE_BYTES:
            msg = f"a skill archive may be at most {MAX_ARCHIVE_BYTES} bytes"
            raise PayloadTooLarge(msg, param="archive")
        out.write(chunk)


def _normalise(tree: Path) -> None:
    """Root's, readable by all, writable by none but root (the container's uids are not)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        os.chown(dirpath, 0, 0)
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(path)
                if os.path.islink(path):
                    os.lchown(path, 0, 0)
                    continue
                os.chown(path, 0, 0)
                os.chmod(path, 0o755 if st.st_mode & 0o111 else 0o644)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                os.lchown(path, 0, 0)
