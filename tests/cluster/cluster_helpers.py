"""Helpers of the cluster lane (imported as ``cluster_helpers``; tests/ is not a package)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from shellbox.sandbox import hostns


def make_state_dir(prefix: str) -> Path:
    """A state directory the containers' root uid can traverse (not pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


def remove_state_dir(path: Path) -> None:
    """The state directory and the runtime's volatile directory for it in /run."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    hostns.detach(str(path / "disks"))
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(Path("/run/shellbox") / key, ignore_errors=True)
