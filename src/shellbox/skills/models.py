"""Skill records the service hands to the API layer, and how a version is named."""

from __future__ import annotations

from typing import Literal

from shellbox.errors import InvalidRequest
from shellbox.store.records import SkillRecord, SkillVersionRecord

__all__ = ["SkillRecord", "SkillVersionRecord", "VersionRef", "parse_version"]

# A version as a client names it: a number, "latest", or None for the skill's default.
VersionRef = int | Literal["latest"] | None
MAX_VERSION = 2**31 - 1  # past what every database's INTEGER holds


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
