"""Paths under a container's ``/mnt/data`` as clients give them: normalised and checked
against what the kernel would refuse, before any runtime touches a disk.

Pure functions of text, shared by the service layer (which checks a client's path once, naming
the request's field) and every runtime (which walks it on its own side of the seam).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from shellbox.errors import InvalidRequest

DATA_MOUNT = "/mnt/data"
NAME_MAX = 255  # bytes in one path component (Linux)
PATH_MAX = 4096  # bytes in a whole path, its NUL included (Linux)


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
    rel = "/".join(parts)
    check_name_limits(rel, shown=path, param=param)
    return rel


def check_name_limits(rel: str, *, shown: str, param: str) -> None:
    """Refuse what the kernel would refuse (a name over NAME_MAX bytes, a path over PATH_MAX,
    text that is not valid UTF-8) before anything touches the disk."""
    try:
        encoded = [part.encode() for part in rel.split("/")]
    except UnicodeEncodeError:
        msg = f"{shown!r} is not valid UTF-8 text (it holds an unpaired surrogate)"
        raise InvalidRequest(msg, param=param) from None
    longest = max(encoded, key=len)
    if len(longest) > NAME_MAX:
        msg = (
            f"the path component {_short(longest)} is {len(longest)} bytes long; a file or "
            f"directory name may be at most {NAME_MAX} bytes"
        )
        raise InvalidRequest(msg, param=param)
    total = len(DATA_MOUNT) + 1 + sum(len(e) + 1 for e in encoded) - 1
    if total >= PATH_MAX:
        msg = f"the path is {total} bytes long; a path may be at most {PATH_MAX - 1} bytes"
        raise InvalidRequest(msg, param=param)


def _short(name: bytes) -> str:
    text = name.decode(errors="replace")
    return repr(text if len(text) <= 40 else text[:40] + "...")
