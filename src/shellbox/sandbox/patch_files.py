"""Applying V4A operations to a data directory on this host, as the sandbox user would.

The OCI runtime's half of ``Runtime.apply_patch``. The diff logic is the pure
``shellbox.patch`` library; this module does the file side. Files are read and written
through the symlink-proof ``datafs`` helpers, with the sandbox user's permissions checked as
the kernel would check them for uid 1000 (a file the sandbox user cannot write cannot be
patched) and new files owned by that user.

A call is atomic: every operation is computed in memory first (later operations see earlier
ones), and only when all succeed are the files written. If writing fails half-way, what was
already written is put back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shellbox.errors import FileNotFound, InvalidRequest
from shellbox.patch import PatchError, PatchOperation, apply_diff
from shellbox.sandbox import datafs as fs

R, W, X = 4, 2, 1
MAX_PATCH_FILE_BYTES = 64 << 20


class OperationFailed(Exception):
    """One operation cannot be applied; the message is written for the model."""


def _may(st: os.stat_result, want: int, uid: int) -> bool:
    """Would uid/gid 1000 inside the sandbox (host ``uid``) get ``want`` access to this inode?"""
    if st.st_uid == uid:
        bits = (st.st_mode >> 6) & 7
    elif st.st_gid == uid:
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return bits & want == want


@dataclass
class _Original:
    content: bytes | None  # None: the file did not exist
    mode: int


class Workspace:
    """The files of one container's data directory, as one patch call sees them."""

    def __init__(self, root: Path, uid: int) -> None:
        self.root = root
        self.uid = uid  # the host uid of the container's sandbox user
        self.pending: dict[str, str | None] = {}  # rel -> new text, None = delete
        self.modes: dict[str, int] = {}
        self.originals: dict[str, _Original] = {}

    def _lstat(self, rel: str) -> os.stat_result | None:
        try:
            return fs.lstat(self.root, rel)
        except InvalidRequest as exc:  # a symlink or a file on the way
            raise OperationFailed(exc.message) from None

    def _check_dir_writable(self, rel: str) -> None:
        """The nearest existing directory above ``rel`` must let uid 1000 add/remove entries."""
        parts = rel.split("/")[:-1]
        while True:
            d = "/".join(parts)
            # Walked without following symlinks, so nothing about host paths leaks through
            # a link the sandbox planted on the way.
            found = self._lstat(d) if d else os.lstat(self.root)
            if found is None:
                parts = parts[:-1]
                continue
            st = found
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                msg = f"/mnt/data/{d} is not a directory (or is a symbolic link)"
                raise OperationFailed(msg)
            if not _may(st, W | X, self.uid):
                msg = f"permission denied: the sandbox user cannot write in /mnt/data/{d or ''}"
                raise OperationFailed(msg.rstrip("/"))
            return

    def exists(self, rel: str) -> bool:
        if rel in self.pending:
            return self.pending[rel] is not None
        return self._lstat(rel) is not None

    def read(self, rel: str, *, for_write: bool) -> str:
        if rel in self.pending:
            text = self.pending[rel]
            if text is None:
                msg = f"/mnt/data/{rel} was deleted earlier in this patch"
                raise OperationFailed(msg)
            return text
        try:
            fd = fs.open_read(self.root, rel)
        except FileNotFound:
            msg = f"/mnt/data/{rel} does not exist"
            raise OperationFailed(msg) from None
        except InvalidRequest as exc:
            raise OperationFailed(exc.message) from None
        try:
            st = os.fstat(fd)
            if not _may(st, R, self.uid) or (for_write and not _may(st, W, self.uid)):
                what = "write" if for_write else "read"
                msg = f"permission denied: the sandbox user cannot {what} /mnt/data/{rel}"
                raise OperationFailed(msg)
            if st.st_size > MAX_PATCH_FILE_BYTES:
                msg = f"/mnt/data/{rel} is larger than {MAX_PATCH_FILE_BYTES >> 20} MiB"
                raise OperationFailed(msg)
            data = b"".join(fs.read_chunks(os.dup(fd)))
            self.modes.setdefault(rel, stat.S_IMODE(st.st_mode))
            self.originals.setdefault(rel, _Original(data, stat.S_IMODE(st.st_mode)))
        finally:
            os.close(fd)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            msg = f"/mnt/data/{rel} is not UTF-8 text; apply_patch edits text files only"
            raise OperationFailed(msg) from None

    def stage(self, rel: str, text: str | None) -> None:
        if rel not in self.originals:
            st = self._lstat(rel)
            if st is not None and stat.S_ISREG(st.st_mode):
                self.read(rel, for_write=False)
            else:
                self.originals[rel] = _Original(None, 0o644)
        self.pending[rel] = text

    def commit(self) -> None:
        done: list[str] = []
        try:
            for rel, text in self.pending.items():
                if text is None:
                    with contextlib.suppress(FileNotFound):
                        fs.delete(self.root, rel)
                else:
                    fs.write_file(
                        self.root,
                        rel,
                        iter([text.encode()]),
                        uid=self.uid,
                        mode=self.modes.get(rel, 0o644),
                    )
                done.append(rel)
        except (OSError, InvalidRequest):
            for rel in done:  # put back what this call already changed
                orig = self.originals[rel]
                try:
                    if orig.content is None:
                        fs.delete(self.root, rel)
                    else:
                        fs.write_file(
                            self.root,
                            rel,
                            iter([orig.content]),
                            uid=self.uid,
                            mode=orig.mode,
                        )
                except (OSError, InvalidRequest, FileNotFound):
                    pass
            raise


def _apply_one(ws: Workspace, op: PatchOperation) -> str:
    try:
        rel = fs.relative_path(op.path)
        target = fs.relative_path(op.move_to) if op.move_to else None
    except InvalidRequest as exc:
        raise OperationFailed(exc.message) from None
    shown = op.path
    if op.type == "create_file":
        if ws.exists(rel):
            msg = f"{shown} already exists; use update_file to change it"
            raise OperationFailed(msg)
        ws._check_dir_writable(rel)
        ws.stage(rel, apply_diff("", op.diff, mode="create"))
        return f"Created {shown}"
    if not ws.exists(rel):
        hint = "create_file to make it" if op.type == "update_file" else "nothing to delete"
        msg = (
            f"{shown} does not exist; use {hint}"
            if op.type == "update_file"
            else (f"{shown} does not exist; there is {hint}")
        )
        raise OperationFailed(msg)
    if op.type == "delete_file":
        ws._check_dir_writable(rel)
        ws.read(rel, for_write=False)
        ws.stage(rel, None)
        return f"Deleted {shown}"
    text = ws.read(rel, for_write=True)
    new = apply_diff(text, op.diff)
    if target and target != rel:
        if ws.exists(target):
            msg = f"cannot move {shown} to {op.move_to}: it already exists"
            raise OperationFailed(msg)
        ws._check_dir_writable(rel)
        ws._check_dir_writable(target)
        ws.modes[target] = ws.modes.get(rel, 0o644)
        ws.stage(rel, None)
        ws.stage(target, new)
        return f"Updated {shown}\nMoved {shown} to {op.move_to}"
    ws.stage(rel, new)
    return f"Updated {shown}"


def apply_operations(root: Path, uid: int, ops: Sequence[PatchOperation]) -> tuple[bool, str]:
    """Apply all or nothing, as host ``uid`` (the container's sandbox user); returns
    (completed, output text)."""
    ws = Workspace(root, uid)
    lines = []
    for index, op in enumerate(ops, start=1):
        try:
            lines.append(_apply_one(ws, op))
        except (OperationFailed, PatchError) as exc:
            where = (
                f"operation {index} ({op.type} {op.path})"
                if len(ops) > 1
                else (f"{op.type} {op.path}")
            )
            unchanged = " No changes were made." if len(ops) > 1 else ""
            return False, f"apply_patch failed at {where}: {exc}{unchanged}"
    try:
        ws.commit()
    except (OSError, InvalidRequest) as exc:
        text = (
            exc.message if isinstance(exc, InvalidRequest) else os.strerror(exc.errno or errno.EIO)
        )
        return False, f"apply_patch failed while writing: {text}. No changes were made."
    return True, "\n".join(lines)
