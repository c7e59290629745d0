"""Who is calling: what every layer passes along with a request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    """Who is calling: the project their key belongs to."""

    project: str
    key_id: str | None = None
