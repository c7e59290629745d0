"""Domain records the service hands to the API layer (the rows are the store's)."""

from __future__ import annotations

from shellbox.principal import Principal
from shellbox.store.records import (
    ContainerFileRecord,
    ContainerRecord,
    ContainerStatus,
    FileRecord,
)

__all__ = ["ContainerFileRecord", "ContainerRecord", "ContainerStatus", "FileRecord", "Principal"]
