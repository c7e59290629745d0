"""Skills: versioned folders with a ``SKILL.md`` that containers mount read-only.

``install(services)`` is the feature's entry in ``services.FEATURES``: it builds the
``SkillService`` (``services.extras["skills"]``) and hooks it into container creation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shellbox.skills.service import SkillService

if TYPE_CHECKING:
    from shellbox.services import Services

__all__ = ["SkillService", "install"]


def install(services: Services) -> None:
    services.extras["skills"] = SkillService(
        services.settings, services.stores.skills, services.containers
    )
