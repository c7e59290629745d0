"""Skills: versioned folders with a ``SKILL.md`` that containers mount read-only.

``install`` (called by the composition root, ``services.py``) builds the ``SkillService``
and hooks it into container creation.
"""

from __future__ import annotations

from shellbox.service.containers import ContainerService
from shellbox.settings import Settings
from shellbox.skills.service import SkillService
from shellbox.store import SkillStore

__all__ = ["SkillService", "install"]


def install(settings: Settings, store: SkillStore, containers: ContainerService) -> SkillService:
    """The skills feature, hooked into container creation."""
    return SkillService(settings, store, containers)
