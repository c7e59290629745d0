"""Skills: versioned folders with a ``SKILL.md`` that containers mount read-only.

``install`` (called by the composition root, ``services.py``) builds the ``SkillService``;
the root attaches its ``mounts`` (a ``ContainerFeature``) to container creation.
"""

from __future__ import annotations

from shellbox.sandbox import Runtime
from shellbox.settings import Settings
from shellbox.skills.service import SkillService
from shellbox.store import ContainerStore, SkillStore
from shellbox.store.blobs import BlobStore

__all__ = ["SkillService", "install"]


def install(
    settings: Settings,
    store: SkillStore,
    container_rows: ContainerStore,
    runtime: Runtime,
    blobs: BlobStore | None = None,
) -> SkillService:
    """The skills feature (the caller attaches ``mounts`` to container creation); ``blobs``:
    where bundles are shared between API replicas."""
    return SkillService(settings, store, container_rows, runtime, blobs)
