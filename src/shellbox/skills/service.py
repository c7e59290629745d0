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
from typing import IO

import anyio

from shellbox.errors import InvalidRequest, SkillNotFound
from shellbox.ids import new_id
from shellbox.principal import Principal
from shellbox.sandbox import Runtime
from shellbox.settings import Settings
from shellbox.skills.bundle import BundleUpload, Caps, Manifest, stage, unpack_zip
from shellbox.skills.models import SkillRecord, SkillVersionRecord, VersionRef, parse_version
from shellbox.skills.mounts import SkillMounts
from shellbox.skills.paths import SkillPaths, remove
from shellbox.store import ContainerStore, SkillStore
from shellbox.store.blobs import BlobStore
from shellbox.store.db import Order
from shellbox.store.skills import NewVersion


class SkillService:
    def __init__(
        self,
        settings: Settings,
        store: SkillStore,
        container_rows: ContainerStore,
        runtime: Runtime,
        blobs: BlobStore | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        # API replicas: every bundle is kept in the database too, and a replica that lacks a
        # version's files (another one received the upload) fetches and unpacks them.
        self.blobs = blobs
        self.caps = Caps.from_settings(settings.skills)
        self.paths = SkillPaths(settings.state_dir)
        self.paths.ensure()
        self.in_containers = SkillMounts(
            paths=self.paths,
            skills=store,
            container_rows=container_rows,
            caps=self.caps,
            max_per_container=settings.skills.max_per_container,
            resolve=self.resolve,
            runtime=runtime,
            fetch=self.fetch if blobs is not None else None,
        )

    async def start(self) -> None:
        """Remove what a previous run left: half-done uploads, versions nobody uses."""
        await self.in_containers.collect_all()

    # -- lookups ----------------------------------------------------------------------------

    def get(self, principal: Principal, skill_id: str) -> SkillRecord:
        return self.store.get(principal.project, skill_id)

    def list_skills(
        self, principal: Principal, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillRecord], bool]:
        return self.store.page(principal.project, after=after, limit=limit, order=order)

    def resolve(
        self, principal: Principal, skill_id: str, ref: VersionRef, *, param: str
    ) -> SkillVersionRecord:
        """The version a container reference names (None: the default)."""
        return self.store.resolve(principal.project, skill_id, ref, param=param)

    def get_version(self, principal: Principal, skill_id: str, version: str) -> SkillVersionRecord:
        return self.resolve(principal, skill_id, _path_version(version), param="version")

    def list_versions(
        self, principal: Principal, skill_id: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SkillVersionRecord], bool]:
        self.get(principal, skill_id)
        return self.store.versions(
            principal.project, skill_id, after=after, limit=limit, order=order
        )

    def open_content(
        self, principal: Principal, skill_id: str, version: str | None
    ) -> tuple[IO[bytes], int, str]:
        """The bundle zip of a version (None: the default): open file, size, a filename."""
        ref = None if version is None else _path_version(version)
        record = self.resolve(principal, skill_id, ref, param="version")
        path = self.paths.bundle(record.skill_id, record.version)
        if self.blobs is not None and not path.exists():
            self._fetch(record.skill_id, record.version)
        try:
            f = open(path, "rb")  # noqa: SIM115 - the response streams and closes it
        except FileNotFoundError:  # deleted between the lookup and here
            msg = f"Skill '{skill_id}' has no version '{record.version}'."
            raise SkillNotFound(msg, param="version") from None
        size = Path(path).stat().st_size
        return f, size, f"{record.name}-{record.version}.zip"

    # -- shared bundles (API replicas) --------------------------------------------------------

    def _place(self, staged: Path, skill_id: str, number: int) -> Path:
        """Move a checked upload to its version's place, and keep its bundle for the other
        replicas (in the version's transaction: a failed one removes it again)."""
        placed = self.paths.place(staged, skill_id, number)
        if self.blobs is not None:
            self.blobs.put(bundle_key(skill_id, number), placed / "bundle.zip")
        return placed

    def _forget(self, skill_id: str, numbers: list[int]) -> None:
        if self.blobs is not None:
            self.blobs.delete([bundle_key(skill_id, n) for n in numbers])

    async def fetch(self, skill_id: str, number: int) -> None:
        """Make a version's files here from its bundle in the database (another replica
        received the upload); nothing if they are here already."""
        await anyio.to_thread.run_sync(self._fetch, skill_id, number)

    def _fetch(self, skill_id: str, number: int) -> None:
        if self.blobs is None or self.paths.files(skill_id, number).is_dir():
            return
        blob = self.blobs.open(bundle_key(skill_id, number))
        if blob is None:
            msg = f"Skill '{skill_id}' has no version '{number}'."
            raise SkillNotFound(msg, param="version")
        staged = self.paths.new_staging()
        try:
            bundle = staged / "bundle.zip"
            with open(bundle, "wb") as out:
                for chunk in blob.chunks:
                    out.write(chunk)
            unpack_zip(bundle, blob.size, staged / "files", self.caps)
            if not self.paths.files(skill_id, number).is_dir():  # (a concurrent fetch)
                self.paths.place(staged, skill_id, number)
        finally:
            remove(staged)

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
        try:
            return self.store.create(
                principal.project,
                skill_id,
                _new_version(manifest),
                lambda: self._place(staged, skill_id, 1),  # in the transaction
            )
        except BaseException:
            remove(staged)
            remove(self.paths.skill_dir(skill_id))
            self._forget(skill_id, [1])
            raise

    async def create_version(
        self, principal: Principal, skill_id: str, upload: BundleUpload, make_default: bool
    ) -> SkillVersionRecord:
        self.get(principal, skill_id)  # a 404 before reading the upload
        staged, manifest = await self._stage(upload)
        placed: list[tuple[Path, int]] = []
        try:
            return self.store.add_version(
                principal.project,
                skill_id,
                _new_version(manifest),
                make_default=make_default,
                place=lambda number: placed.append((self._place(staged, skill_id, number), number)),
            )
        except BaseException:
            remove(staged)
            for path, _ in placed:
                remove(path)
            self._forget(skill_id, [n for _, n in placed])
            raise

    def update(self, principal: Principal, skill_id: str, default_version: object) -> SkillRecord:
        """Move the default pointer (``latest`` means the current latest number)."""
        ref = parse_version(default_version, param="default_version")
        if ref is None:
            msg = "default_version is required: the version number to make the default"
            raise InvalidRequest(msg, param="default_version")
        self.store.set_default(principal.project, skill_id, ref, param="default_version")
        return self.get(principal, skill_id)

    async def delete(self, principal: Principal, skill_id: str) -> None:
        numbers = self.store.delete(principal.project, skill_id)
        self._forget(skill_id, numbers)
        await self.in_containers.collect({(skill_id, n) for n in numbers})

    async def delete_version(
        self, principal: Principal, skill_id: str, version: str
    ) -> SkillVersionRecord:
        ref = _path_version(version)

        def not_the_default(skill: SkillRecord, number: int) -> None:
            if number == skill.default_version:
                msg = (
                    f"version {number} is the default version of skill {skill_id}; make "
                    "another version the default first (POST /v1/skills/{id} with "
                    "default_version), or delete the whole skill"
                )
                raise InvalidRequest(msg, param="version")

        record = self.store.delete_version(principal.project, skill_id, ref, not_the_default)
        self._forget(skill_id, [record.version])
        await self.in_containers.collect({(skill_id, record.version)})
        return record


def bundle_key(skill_id: str, number: int) -> str:
    return f"skills/{skill_id}/{number}.zip"


def _path_version(raw: str) -> VersionRef:
    ref = parse_version(raw, param="version")
    if ref is None:
        msg = "version is required"
        raise InvalidRequest(msg, param="version")
    return ref


def _new_version(manifest: Manifest) -> NewVersion:
    return NewVersion(
        id=new_id("skillver_"),
        name=manifest.name,
        description=manifest.description,
        files=manifest.files,
        bytes=manifest.bytes,
        created_at=int(time.time()),
    )
