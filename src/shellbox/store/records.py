"""The rows the store hands out, as plain dataclasses (the service hands them on to the API)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ContainerStatus = Literal["running", "sleeping", "paused", "expired", "deleted"]
LIVE: tuple[ContainerStatus, ...] = ("running", "sleeping", "paused")


@dataclass
class ContainerRecord:
    id: str
    project: str
    name: str
    status: ContainerStatus
    created_at: int
    last_active_at: int
    expires_after_minutes: int
    memory_limit: str
    network_policy: dict[str, Any]
    secrets: list[dict[str, str]] = field(default_factory=list)
    skills: list[dict[str, Any]] = field(default_factory=list)
    snapshot_id: str | None = None  # the snapshot it was forked from

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ContainerRecord:
        return cls(
            id=row["id"],
            project=row["project"],
            name=row["name"],
            status=row["status"],
            created_at=row["created_at"],
            last_active_at=row["last_active_at"],
            expires_after_minutes=row["expires_after_minutes"],
            memory_limit=row["memory_limit"],
            network_policy=row["network_policy"] or {"type": "disabled"},
            secrets=row["secrets"] or [],
            skills=row["skills"] or [],
            snapshot_id=row["snapshot_id"],
        )


@dataclass(frozen=True)
class FileRecord:
    id: str
    project: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> FileRecord:
        return cls(
            row["id"],
            row["project"],
            row["filename"],
            row["purpose"],
            row["bytes"],
            row["created_at"],
            row["expires_at"],
        )


@dataclass(frozen=True)
class ContainerFileRecord:
    id: str
    container_id: str
    path: str  # relative to /mnt/data
    bytes: int
    created_at: int
    source: str
    mtime_ns: int = 0

    @property
    def container_path(self) -> str:
        return f"/mnt/data/{self.path}"

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ContainerFileRecord:
        return cls(
            row["id"],
            row["container_id"],
            row["path"],
            row["bytes"],
            row["created_at"],
            row["source"],
            row["mtime_ns"],
        )


@dataclass(frozen=True)
class ApiKey:
    id: str
    project: str
    prefix: str
    created_at: int
    revoked_at: int | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ApiKey:
        return cls(row["id"], row["project"], row["prefix"], row["created_at"], row["revoked_at"])


@dataclass(frozen=True)
class SkillRecord:
    id: str
    project: str
    name: str
    description: str
    created_at: int
    default_version: int
    latest_version: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SkillRecord:
        return cls(
            row["id"],
            row["project"],
            row["name"],
            row["description"],
            row["created_at"],
            row["default_version"],
            row["latest_version"],
        )


@dataclass(frozen=True)
class SkillVersionRecord:
    id: str
    skill_id: str
    version: int
    name: str
    description: str
    created_at: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SkillVersionRecord:
        return cls(
            row["id"],
            row["skill_id"],
            row["version"],
            row["name"],
            row["description"],
            row["created_at"],
        )


@dataclass(frozen=True)
class StoredResponse:
    id: str
    container_id: str | None
    body: dict[str, Any]
    conversation: list[dict[str, Any]]


@dataclass(frozen=True)
class IdempotencyRecord:
    route: str
    fingerprint: str
    state: str  # in_progress | done
    run: str
    resource_id: str | None
    status: int | None
    content_type: str | None
    body: bytes | None
    created_at: int
