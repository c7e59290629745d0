"""Domain records the service hands to the API layer (the rows are the store's)."""

from __future__ import annotations

from dataclasses import dataclass

from shellbox.store.records import (
    ContainerFileRecord,
    ContainerRecord,
    ContainerStatus,
    FileRecord,
)

__all__ = ["ContainerFileRecord", "ContainerRecord", "ContainerStatus", "FileRecord", "Principal"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the project their key belongs to."""

    project: str
    key_id: str | None = None
