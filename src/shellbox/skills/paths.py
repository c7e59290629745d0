"""Where skills live on the host.

    <state>/skills/
      staging/<tmp>/                  an upload being checked; renamed into place when valid
      versions/<skill_id>/<n>/
        bundle.zip                    the bytes served back by the content endpoints
        files/                        unpacked once; handed to the runtime as a tar
                                      (``Runtime.install_skill``), which mounts its own copy
      containers/<container_id>/      made by servers before skills went by value (an index
                                      and inline skills); removed with their container

Everything is owned by host root. Files are 0644 (0755 when executable) and folders 0755, so
the sandbox user (uid 1000 of its container's own host uid range, no relation to root) can
read but not write them; the folders above are 0711: the container's root must traverse them
to bind-mount, nobody needs to list them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _safe(part: str) -> str:
    # Ids are ours (skill_..., cntr_...), but a path component is never taken on trust.
    if not part or "/" in part or part.startswith(".") or "\x00" in part:
        msg = f"not a valid path component: {part!r}"
        raise ValueError(msg)
    return part


class SkillPaths:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "skills"
        self.staging = self.root / "staging"
        self.versions = self.root / "versions"
        self.containers = self.root / "containers"

    def ensure(self) -> None:
        for d in (self.root, self.staging, self.versions, self.containers):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o711)

    def new_staging(self) -> Path:
        path = Path(tempfile.mkdtemp(dir=self.staging))
        os.chmod(path, 0o711)
        return path

    def skill_dir(self, skill_id: str) -> Path:
        return self.versions / _safe(skill_id)

    def version_dir(self, skill_id: str, version: int) -> Path:
        return self.skill_dir(skill_id) / str(version)

    def bundle(self, skill_id: str, version: int) -> Path:
        return self.version_dir(skill_id, version) / "bundle.zip"

    def files(self, skill_id: str, version: int) -> Path:
        return self.version_dir(skill_id, version) / "files"

    def container_dir(self, container_id: str) -> Path:
        return self.containers / _safe(container_id)

    def place(self, staged: Path, skill_id: str, version: int) -> Path:
        """Move a checked upload to its version's place."""
        target = self.version_dir(skill_id, version)
        target.parent.mkdir(exist_ok=True)
        os.chmod(target.parent, 0o711)
        if target.exists():  # left by a crash between this rename and the database commit
            shutil.rmtree(target)
        os.rename(staged, target)
        return target


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
