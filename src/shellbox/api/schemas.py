"""Wire shapes: request bodies as pydantic models (they make the OpenAPI schema), responses
as plain dicts built from the service's records (mirroring the OpenAI objects)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shellbox.service.models import ContainerFileRecord, ContainerRecord, FileRecord


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExpiresAfter(_Body):
    anchor: Literal["last_active_at"]
    minutes: int = Field(ge=1, le=10_080)


class DomainSecret(_Body):
    domain: str
    name: str
    value: str


class NetworkPolicy(_Body):
    type: Literal["disabled", "allowlist"]
    allowed_domains: list[str] | None = None
    domain_secrets: list[DomainSecret] | None = None


class CreateContainerBody(_Body):
    name: str = Field(max_length=256)
    expires_after: ExpiresAfter | None = None
    file_ids: list[str] | None = Field(None, max_length=100)
    memory_limit: Literal["1g", "4g", "16g", "64g"] | None = None
    network_policy: NetworkPolicy | None = None
    skills: list[dict[str, Any]] | None = None


class CreateContainerFileBody(_Body):
    file_id: str


def image(rootfs: Path) -> dict[str, str]:
    """Which sandbox image a container runs (an extension field: the SDK keeps extra fields).
    The id is ``<profile>-<recipe hash>``; ``shellbox image info`` lists its versions."""
    name = rootfs.parent.name
    return {"id": name, "profile": name.rpartition("-")[0]}


def container(record: ContainerRecord, rootfs: Path) -> dict[str, Any]:
    policy: dict[str, Any] = {"type": record.network_policy.get("type", "disabled")}
    if policy["type"] == "allowlist":
        policy["allowed_domains"] = list(record.network_policy.get("allowed_domains", []))
    return {
        "id": record.id,
        "object": "container",
        "name": record.name,
        "created_at": record.created_at,
        "status": record.status,
        "expires_after": {"anchor": "last_active_at", "minutes": record.expires_after_minutes},
        "last_active_at": record.last_active_at,
        "memory_limit": record.memory_limit,
        "network_policy": policy,
        "image": image(rootfs),
    }


def file(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
    }


def container_file(record: ContainerFileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "container.file",
        "container_id": record.container_id,
        "path": record.container_path,
        "bytes": record.bytes,
        "created_at": record.created_at,
        "source": record.source,
    }


def page(data: Sequence[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def deleted(obj_id: str, obj: str) -> dict[str, Any]:
    return {"id": obj_id, "object": obj, "deleted": True}
