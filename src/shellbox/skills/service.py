"""The Skills API: skills, their immutable numbered versions, and their bundles.

Creating a skill makes version 1, its default and latest. A new version takes the next
number (numbers are never reused) and becomes the default only when asked. The default
version cannot be deleted (move the default first, or delete the skill). ``latest`` is
accepted wherever a version is named. Everything is scoped to the caller's project: another
project's skill is a 404, exactly like one that does not exist.

Deleting a version or a skill removes it from the API at once; its unpacked files stay on
disk while a living container mounts them (see ``mounts``).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import IO, Any

import anyio
from sqlalchemy import Row, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from shellbox.errors import InvalidRequest, ShellboxError, SkillNotFound
from shellbox.ids import new_id
from shellbox.service.containers import ContainerService
from shellbox.service.models import Principal
from shellbox.settings import Settings
from shellbox.skills.bundle import BundleUpload, Caps, Manifest, stage
from shellbox.skills.models import SkillRecord, SkillVersionRecord, VersionRef, parse_version
from shellbox.skills.mounts import SkillMounts
from shellbox.skills.paths import SkillPaths, remove
from shellbox.skills.store import TABLES, skill_versions, skills
from shellbox.store import Database
from shellbox.store.db import Order
from shellbox.store.tables import metadata

MAX_VERSION_RACES = 5


class SkillService:
    def __init__(self, settings: Settings, db: Database, containers: ContainerService) -> None:
        self.settings = settings
        self.db = db
        self.caps = Caps.from_settings(settings.skills)
        self.paths = SkillPaths(settings.state_dir)
        self.paths.ensure()
        metadata.create_all(db.engine, tables=list(TABLES))  # in case they were not there yet
        self.mounts = SkillMounts(
            paths=self.paths,
            db=db,
            caps=self.caps,
            max_per_container=settings.skills.max_per_container,
            resolve=self.resolve,
            containers_service=containers,
        )

    async def start(self) -> None:
        """Remove what a previous run left: half-done uploads, versions nobody uses."""
        await self.mounts.collect_all()

    # -- lookups ----------------------------------------------------------------------------

    @staticmethod
    def _skill_row(conn: Connection, principal: Principal, skill_id: str) -> Row[Any]:
        row = conn.execute(
            select(skills).where(skills.c.id == skill_id, skills.c.project == principal.project)
        ).first()
        if row is None:
            msg = f"No skill found with id '{skill_id}'."
            raise SkillNotFound(msg, param="skill_id")
        return row

    @staticmethod
    def _version_row(
        conn: Connection, skill: Row[Any], ref: VersionRef, *, param: str = "version"
    ) -> Row[Any]:
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

    def get(self, principal: Principal, skill_id: str) -> SkillRecord:
        with self.db.connect() as conn:
            return SkillRecord.from_row(self._skill_row(conn, principal, skill_id)._mapping)

    def list_skills(
        self, principal: Principal, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillRecord], bool]:
        page = self.db.page(
            skills, [skills.c.project == principal.project], after=after, limit=limit, order=order
        )
        return [SkillRecord.from_row(r) for r in page.rows], page.has_more

    def resolve(
        self, principal: Principal, skill_id: str, ref: VersionRef, *, param: str
    ) -> SkillVersionRecord:
        """The version a container reference names (None: the default)."""
        with self.db.connect() as conn:
            skill = self._skill_row(conn, principal, skill_id)
            row = self._version_row(conn, skill, ref, param=param)
        return SkillVersionRecord.from_row(row._mapping)

    def get_version(self, principal: Principal, skill_id: str, version: str) -> SkillVersionRecord:
        return self.resolve(principal, skill_id, _path_version(version), param="version")

    def list_versions(
        self, principal: Principal, skill_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillVersionRecord], bool]:
        self.get(principal, skill_id)
        # Numbers only grow with creation order, so the creation cursor orders by number too.
        page = self.db.page(
            skill_versions,
            [skill_versions.c.skill_id == skill_id, skill_versions.c.project == principal.project],
            after=after,
            limit=limit,
            order=order,
        )
        return [SkillVersionRecord.from_row(r) for r in page.rows], page.has_more

    def open_content(
        self, principal: Principal, skill_id: str, version: str | None
    ) -> tuple[IO[bytes], int, str]:
        """The bundle zip of a version (None: the default): open file, size, a filename."""
        ref = None if version is None else _path_version(version)
        record = self.resolve(principal, skill_id, ref, param="version")
        path = self.paths.bundle(record.skill_id, record.version)
        try:
            f = open(path, "rb")  # noqa: SIM115 - the response streams and closes it
        except FileNotFoundError:  # deleted between the lookup and here
            msg = f"Skill '{skill_id}' has no version '{record.version}'."
            raise SkillNotFound(msg, param="version") from None
        size = Path(path).stat().st_size
        return f, size, f"{record.name}-{record.version}.zip"

    # -- changes ----------------------------------------------------------------------------

    async def _stage(self, upload: BundleUpload) -> tuple[Path, Manifest]:
        staged = self.paths.new_staging()
        try:
            manifest = await anyio.to_thread.run_sync(partial(stage, upload, staged, self.caps))
        except BaseException:
            await anyio.to_thread.run_sync(remove, staged)
            raise
        return staged, manifest

    async def create(self, principal: Principal, upload: BundleUpload) -> SkillRecord:
        staged, manifest = await self._stage(upload)
        skill_id = new_id("skill_")
        now = int(time.time())
        try:
            with self.db.begin() as conn:
                conn.execute(
                    insert(skills).values(
                        id=skill_id,
                        project=principal.project,
                        name=manifest.name,
                        description=manifest.description,
                        default_version=1,
                        latest_version=1,
                        next_version=2,
                        created_at=now,
                    )
                )
                self._insert_version(conn, principal, skill_id, 1, manifest, now)
                self.paths.place(staged, skill_id, 1)
        except BaseException:
            remove(staged)
            remove(self.paths.skill_dir(skill_id))
            raise
        return SkillRecord(
            skill_id, principal.project, manifest.name, manifest.description, now, 1, 1
        )

    @staticmethod
    def _insert_version(
        conn: Connection,
        principal: Principal,
        skill_id: str,
        number: int,
        manifest: Manifest,
        now: int,
    ) -> SkillVersionRecord:
        record = SkillVersionRecord(
            new_id("skillver_"), skill_id, number, manifest.name, manifest.description, now
        )
        conn.execute(
            insert(skill_versions).values(
                id=record.id,
                skill_id=skill_id,
                project=principal.project,
                version=number,
                name=manifest.name,
                description=manifest.description,
                files=manifest.files,
                bytes=manifest.bytes,
                created_at=now,
            )
        )
        return record

    async def create_version(
        self, principal: Principal, skill_id: str, upload: BundleUpload, make_default: bool
    ) -> SkillVersionRecord:
        self.get(principal, skill_id)  # a 404 before reading the upload
        staged, manifest = await self._stage(upload)
        placed: Path | None = None
        try:
            for _ in range(MAX_VERSION_RACES):
                with self.db.begin() as conn:
                    skill = self._skill_row(conn, principal, skill_id)
                    number = skill.next_version
                    values: dict[str, Any] = {"next_version": number + 1, "latest_version": number}
                    if make_default:
                        values |= {
                            "default_version": number,
                            "name": manifest.name,
                            "description": manifest.description,
                        }
                    # Compare-and-set on next_version: two nodes adding versions at once
                    # cannot both take the same number.
                    claimed = conn.execute(
                        update(skills)
                        .where(skills.c.id == skill_id, skills.c.next_version == number)
                        .values(**values)
                    ).rowcount
                    if claimed != 1:
                        continue
                    record = self._insert_version(
                        conn, principal, skill_id, number, manifest, int(time.time())
                    )
                    placed = self.paths.place(staged, skill_id, number)
                    return record
            msg = f"skill {skill_id} is being changed by other requests; try again"
            raise ShellboxError(msg)
        except BaseException:
            remove(staged)
            if placed is not None:
                remove(placed)
            raise

    def update(self, principal: Principal, skill_id: str, default_version: object) -> SkillRecord:
        """Move the default pointer (``latest`` means the current latest number)."""
        ref = parse_version(default_version, param="default_version")
        if ref is None:
            msg = "default_version is required: the version number to make the default"
            raise InvalidRequest(msg, param="default_version")
        with self.db.begin() as conn:
            skill = self._skill_row(conn, principal, skill_id)
            version = self._version_row(conn, skill, ref, param="default_version")
            conn.execute(
                update(skills)
                .where(skills.c.id == skill_id)
                .values(
                    default_version=version.version,
                    name=version.name,
                    description=version.description,
                )
            )
        return self.get(principal, skill_id)

    async def delete(self, principal: Principal, skill_id: str) -> None:
        with self.db.begin() as conn:
            self._skill_row(conn, principal, skill_id)
            numbers = [
                r.version
                for r in conn.execute(
                    select(skill_versions.c.version).where(skill_versions.c.skill_id == skill_id)
                )
            ]
            conn.execute(delete(skill_versions).where(skill_versions.c.skill_id == skill_id))
            conn.execute(delete(skills).where(skills.c.id == skill_id))
        await self.mounts.collect({(skill_id, n) for n in numbers})

    async def delete_version(
        self, principal: Principal, skill_id: str, version: str
    ) -> SkillVersionRecord:
        ref = _path_version(version)
        with self.db.begin() as conn:
            skill = self._skill_row(conn, principal, skill_id)
            row = self._version_row(conn, skill, ref)
            if row.version == skill.default_version:
                msg = (
                    f"version {row.version} is the default version of skill {skill_id}; make "
                    "another version the default first (POST /v1/skills/{id} with "
                    "default_version), or delete the whole skill"
                )
                raise InvalidRequest(msg, param="version")
            conn.execute(delete(skill_versions).where(skill_versions.c.id == row.id))
            latest = conn.execute(
                select(func.max(skill_versions.c.version)).where(
                    skill_versions.c.skill_id == skill_id
                )
            ).scalar_one()
            conn.execute(
                update(skills).where(skills.c.id == skill_id).values(latest_version=latest)
            )
        await self.mounts.collect({(skill_id, row.version)})
        return SkillVersionRecord.from_row(row._mapping)


def _path_version(raw: str) -> VersionRef:
    ref = parse_version(raw, param="version")
    if ref is None:
        msg = "version is required"
        raise InvalidRequest(msg, param="version")
    return ref
