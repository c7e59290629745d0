"""Skills and their immutable numbered versions.

Lookups are scoped to a project: another project's skill is "not found", exactly like one
that does not exist. Version numbers are taken with a compare-and-set on ``next_version``,
so two servers adding versions at once never take the same number."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sqlalchemy import Row, delete, func, insert, select, tuple_, update
from sqlalchemy.engine import Connection

from shellbox.errors import ShellboxError, SkillNotFound
from shellbox.store.db import Database, Order
from shellbox.store.records import SkillRecord, SkillVersionRecord
from shellbox.store.tables import skill_versions, skills

MAX_VERSION_RACES = 5
# A version as a client names it: a number, "latest", or None for the skill's default.
Ref = int | Literal["latest"] | None


@dataclass(frozen=True)
class NewVersion:
    id: str
    name: str
    description: str
    files: int
    bytes: int
    created_at: int


class SkillStore(Protocol):
    def get(self, project: str, skill_id: str) -> SkillRecord: ...
    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillRecord], bool]: ...
    def resolve(
        self, project: str, skill_id: str, ref: Ref, *, param: str
    ) -> SkillVersionRecord: ...
    def versions(
        self, project: str, skill_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillVersionRecord], bool]: ...
    def create(
        self, project: str, skill_id: str, version: NewVersion, place: Callable[[], object]
    ) -> SkillRecord: ...
    def add_version(
        self,
        project: str,
        skill_id: str,
        version: NewVersion,
        *,
        make_default: bool,
        place: Callable[[int], object],
    ) -> SkillVersionRecord: ...
    def set_default(self, project: str, skill_id: str, ref: Ref, *, param: str) -> None: ...
    def delete(self, project: str, skill_id: str) -> list[int]: ...
    def delete_version(
        self, project: str, skill_id: str, ref: Ref, check: Callable[[SkillRecord, int], None]
    ) -> SkillVersionRecord: ...
    def existing(self, keys: Iterable[tuple[str, int]]) -> set[tuple[str, int]]: ...


def _skill_row(conn: Connection, project: str, skill_id: str) -> Row[Any]:
    row = conn.execute(
        select(skills).where(skills.c.id == skill_id, skills.c.project == project)
    ).first()
    if row is None:
        msg = f"No skill found with id '{skill_id}'."
        raise SkillNotFound(msg, param="skill_id")
    return row


def _version_row(conn: Connection, skill: Row[Any], ref: Ref, *, param: str) -> Row[Any]:
    if ref is None:
        number = skill.default_version
    elif ref == "latest":
        number = skill.latest_version
    else:
        number = ref
    row = conn.execute(
        select(skill_versions).where(
            skill_versions.c.skill_id == skill.id, skill_versions.c.version == number
        )
    ).first()
    if row is None:
        msg = f"Skill '{skill.id}' has no version '{number}'."
        raise SkillNotFound(msg, param=param)
    return row


def _insert_version(
    conn: Connection, project: str, skill_id: str, number: int, v: NewVersion
) -> SkillVersionRecord:
    conn.execute(
        insert(skill_versions).values(
            id=v.id,
            skill_id=skill_id,
            project=project,
            version=number,
            name=v.name,
            description=v.description,
            files=v.files,
            bytes=v.bytes,
            created_at=v.created_at,
        )
    )
    return SkillVersionRecord(v.id, skill_id, number, v.name, v.description, v.created_at)


class SqlSkillStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, project: str, skill_id: str) -> SkillRecord:
        with self.db.connect() as conn:
            return SkillRecord.from_row(_skill_row(conn, project, skill_id)._mapping)

    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillRecord], bool]:
        page = self.db.page(
            skills, [skills.c.project == project], after=after, limit=limit, order=order
        )
        return [SkillRecord.from_row(r) for r in page.rows], page.has_more

    def resolve(self, project: str, skill_id: str, ref: Ref, *, param: str) -> SkillVersionRecord:
        """The version ``ref`` names (None: the default)."""
        with self.db.connect() as conn:
            skill = _skill_row(conn, project, skill_id)
            row = _version_row(conn, skill, ref, param=param)
        return SkillVersionRecord.from_row(row._mapping)

    def versions(
        self, project: str, skill_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillVersionRecord], bool]:
        # Numbers only grow with creation order, so the creation cursor orders by number too.
        page = self.db.page(
            skill_versions,
            [skill_versions.c.skill_id == skill_id, skill_versions.c.project == project],
            after=after,
            limit=limit,
            order=order,
        )
        return [SkillVersionRecord.from_row(r) for r in page.rows], page.has_more

    def create(
        self, project: str, skill_id: str, version: NewVersion, place: Callable[[], object]
    ) -> SkillRecord:
        """A skill with its version 1; ``place`` runs inside the transaction (if it fails,
        no row is left)."""
        with self.db.begin() as conn:
            conn.execute(
                insert(skills).values(
                    id=skill_id,
                    project=project,
                    name=version.name,
                    description=version.description,
                    default_version=1,
                    latest_version=1,
                    next_version=2,
                    created_at=version.created_at,
                )
            )
            _insert_version(conn, project, skill_id, 1, version)
            place()
        return SkillRecord(
            skill_id, project, version.name, version.description, version.created_at, 1, 1
        )

    def add_version(
        self,
        project: str,
        skill_id: str,
        version: NewVersion,
        *,
        make_default: bool,
        place: Callable[[int], object],
    ) -> SkillVersionRecord:
        """The next version number; ``place(number)`` runs inside the transaction."""
        for _ in range(MAX_VERSION_RACES):
            with self.db.begin() as conn:
                skill = _skill_row(conn, project, skill_id)
                number = skill.next_version
                values: dict[str, Any] = {"next_version": number + 1, "latest_version": number}
                if make_default:
                    values |= {
                        "default_version": number,
                        "name": version.name,
                        "description": version.description,
                    }
                claimed = conn.execute(
                    update(skills)
                    .where(skills.c.id == skill_id, skills.c.next_version == number)
                    .values(**values)
                ).rowcount
                if claimed != 1:
                    continue
                record = _insert_version(conn, project, skill_id, number, version)
                place(number)
                return record
        msg = f"skill {skill_id} is being changed by other requests; try again"
        raise ShellboxError(msg)

    def set_default(self, project: str, skill_id: str, ref: Ref, *, param: str) -> None:
        with self.db.begin() as conn:
            skill = _skill_row(conn, project, skill_id)
            version = _version_row(conn, skill, ref, param=param)
            conn.execute(
                update(skills)
                .where(skills.c.id == skill_id)
                .values(
                    default_version=version.version,
                    name=version.name,
                    description=version.description,
                )
            )

    def delete(self, project: str, skill_id: str) -> list[int]:
        """Delete a skill and its versions; returns the version numbers it had."""
        with self.db.begin() as conn:
            _skill_row(conn, project, skill_id)
            numbers = list(
                conn.scalars(
                    select(skill_versions.c.version).where(skill_versions.c.skill_id == skill_id)
                )
            )
            conn.execute(delete(skill_versions).where(skill_versions.c.skill_id == skill_id))
            conn.execute(delete(skills).where(skills.c.id == skill_id))
        return numbers

    def delete_version(
        self, project: str, skill_id: str, ref: Ref, check: Callable[[SkillRecord, int], None]
    ) -> SkillVersionRecord:
        """Delete a version; ``check(skill, number)`` may refuse it (by raising), in the
        same transaction. ``latest_version`` follows."""
        with self.db.begin() as conn:
            skill = _skill_row(conn, project, skill_id)
            row = _version_row(conn, skill, ref, param="version")
            check(SkillRecord.from_row(skill._mapping), row.version)
            conn.execute(delete(skill_versions).where(skill_versions.c.id == row.id))
            latest = conn.execute(
                select(func.max(skill_versions.c.version)).where(
                    skill_versions.c.skill_id == skill_id
                )
            ).scalar_one()
            conn.execute(
                update(skills).where(skills.c.id == skill_id).values(latest_version=latest)
            )
        return SkillVersionRecord.from_row(row._mapping)

    def existing(self, keys: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
        """Which of these (skill id, version) pairs still have a row."""
        wanted = list(keys)
        if not wanted:
            return set()
        with self.db.connect() as conn:
            rows = conn.execute(
                select(skill_versions.c.skill_id, skill_versions.c.version).where(
                    tuple_(skill_versions.c.skill_id, skill_versions.c.version).in_(wanted)
                )
            ).all()
        return {(r.skill_id, r.version) for r in rows}
