"""Skill records the service hands to the API layer, and how a version is named."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shellbox.errors import InvalidRequest

# A version as a client names it: a number, "latest", or None for the skill's default.
VersionRef = int | Literal["latest"] | None
MAX_VERSION = 2**31 - 1  # past what every database's INTEGER holds


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


def parse_version(raw: object, *, param: str) -> VersionRef:
    """``"3"`` (or 3) -> 3, ``"latest"`` -> "latest", absent -> None; anything else is a 400."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip() == "latest":
        return "latest"
    text = raw.strip() if isinstance(raw, str) else None
    if isinstance(raw, int) and not isinstance(raw, bool):
        number: int | None = raw
    elif text is not None and text.isascii() and text.isdigit():
        number = int(text)
    else:
        number = None
    if number is None or not 1 <= number <= MAX_VERSION:
        msg = f"{param} must be a positive version number (as a string) or 'latest', not {raw!r}"
        raise InvalidRequest(msg, param=param)
    return number
