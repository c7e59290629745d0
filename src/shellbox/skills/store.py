"""Skill tables, on the shared ``metadata`` so ``create_all`` makes them with the others.

A skill's ``name`` and ``description`` are its default version's (copied when the default
moves). Version numbers come from ``next_version`` and are never reused, so a number always
names the same bytes even after its version was deleted.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, String, Table, Text, UniqueConstraint

from shellbox.store.tables import metadata

skills = Table(
    "skills",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("default_version", Integer, nullable=False),
    Column("latest_version", Integer, nullable=False),
    Column("next_version", Integer, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

skill_versions = Table(
    "skill_versions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("skill_id", String(64), nullable=False, index=True),
    Column("project", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),  # unpacked
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("skill_id", "version", name="uq_skill_versions_version"),
)

TABLES = (skills, skill_versions)
