"""Skills: versioned folders with a ``SKILL.md`` that containers mount read-only.

``install`` (called by the composition root, ``services.py``) builds the ``SkillService``;
the root attaches its ``mounts`` (a ``ContainerFeature``) to container creation.
"""

from __future__ import annotations

from shellbox.sandbox import Runtime
from shellbox.settings import Settings
from shellbox.skills.service import SkillService
from shellbox.store import ContainerStore, SkillStore

__all__ = ["SkillService", "install"]


def install(
    settings: Settings, store: SkillStore, container_rows: ContainerStore, runtime: Runtime
) -> SkillService:
    """The skills feature (the caller attaches ``mounts`` to container creation)."""
    return SkillService(settings, store, container_rows, runtime)
