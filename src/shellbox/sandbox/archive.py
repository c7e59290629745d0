"""Tar archives of a container's ``/mnt/data``, made and unpacked inside the container.

Archives are never built or unpacked on the host: ``tar`` runs in the sandbox as the sandbox
user, on a temporary file in ``/mnt/data`` that the runtime writes or reads with its
link-refusing file access. A hostile archive (absolute names, ``..``, symlinks pointing out)
can therefore only do what the sandbox user can already do inside its own container. These
are the commands and the reading of their results; any runtime that can run a command and
move a file can use them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from shellbox.errors import Conflict, FileNotFound, InvalidRequest
from shellbox.ids import new_id
from shellbox.sandbox.base import CommandResult
from shellbox.sandbox.datafs import UPLOAD_PREFIX
from shellbox.sandbox.datapath import DATA_MOUNT

# Temporary archives carry the upload prefix: file listings skip it, so they never show up as
# container files, and ``sweep_uploads`` removes what a crash left.
TEMP_PREFIX = UPLOAD_PREFIX
TAR_MESSAGE_CHARS = 2000
EXIT_NO_DIRECTORY = 3


def absolute(rel: str) -> str:
    return f"{DATA_MOUNT}/{rel}" if rel else DATA_MOUNT


def temp_name(kind: str) -> str:
    """A fresh temporary archive's name, directly under /mnt/data."""
    return f"{TEMP_PREFIX}{kind}-{new_id('', 8)}.tar"


def export_command(rel_dir: str, tmp: str, exclude: Sequence[str]) -> str:
    """Archive the directory into ``tmp``, leaving out temporaries and ``exclude`` (member
    names, ``./a/b``)."""
    return " ".join(
        [
            f"cd -- {shlex.quote(absolute(rel_dir))} || exit {EXIT_NO_DIRECTORY};",
            f"exec tar --create --file={shlex.quote(absolute(tmp))}",
            f"--wildcards --exclude={shlex.quote('./' + TEMP_PREFIX + '*')}",
            "--no-wildcards --anchored",
            *(f"--exclude={shlex.quote(p)}" for p in exclude),
            ".",
        ]
    )


def import_command(rel_dir: str, tmp: str) -> str:
    target = shlex.quote(absolute(rel_dir))
    return (
        f"mkdir -p -- {target} && exec tar --extract --file={shlex.quote(absolute(tmp))}"
        f" --directory={target} --no-same-owner --no-overwrite-dir"
    )


def check_tar(result: CommandResult, rel_dir: str, *, creating: bool) -> None:
    """Raise the client's error for a tar that failed."""
    where = absolute(rel_dir)
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
