"""Skills inside containers: the provisioning hook, the index, and collecting unused files.

A container's ``skills`` (``skill_reference`` and ``inline`` entries) become read-only mounts
at ``/mnt/skills/<name>/`` plus ``/mnt/skills/index.json`` listing them, all by value: each
skill is handed to the runtime as a tar (``Runtime.install_skill``) under a key, and the
container's spec names the keys and the index's text. A referenced version is installed once
per runtime (key ``<skill id>.<version>``) and shared by every container that mounts it; an
inline skill is installed for its container alone (``inline.<container>.<name>``) and
removed with it. Nothing here knows where the runtime keeps them, or on which machine.

A version's files (here and in the runtime) are removed only when both its database row is
gone (deleted through the API) and no living container (running or sleeping, or being
created right now) mounts it: deleting a skill never pulls the floor from under a container
that uses it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio

from shellbox.errors import InvalidRequest, ShellboxError
from shellbox.features import ContainerFeature, CreateContainer, Provisioned
from shellbox.principal import Principal
from shellbox.sandbox import Runtime, SkillMount
from shellbox.skills.archive import tar_chunks
from shellbox.skills.bundle import MAX_DESCRIPTION, Caps, check_name, unpack_zip
from shellbox.skills.models import SkillVersionRecord, parse_version
from shellbox.skills.paths import SkillPaths, remove
from shellbox.store import ContainerStore, SkillStore
from shellbox.store.records import ContainerRecord

log = logging.getLogger("shellbox.skills")
MOUNT_ROOT = "/mnt/skills"
INDEX = f"{MOUNT_ROOT}/index.json"

VersionKey = tuple[str, int]  # (skill id, version number)
INLINE = "inline"  # the first part of an inline skill's runtime key


def runtime_key(key: VersionKey) -> str:
    """What the runtime holds a referenced version as."""
    return f"{key[0]}.{key[1]}"


def inline_key(cid: str, name: str) -> str:
    return f"{INLINE}.{cid}.{name}"


@dataclass(frozen=True)
class _Reference:
    version: SkillVersionRecord

    @property
    def name(self) -> str:
        return self.version.name


@dataclass(frozen=True)
class _Inline:
    name: str
    description: str
    data: bytes
    param: str


def _inline(raw: dict[str, Any], param: str, max_bytes: int) -> _Inline:
    name, description, source = raw.get("name"), raw.get("description"), raw.get("source")
    if not isinstance(name, str):
        msg = f"{param}.name is required for an inline skill"
        raise InvalidRequest(msg, param=f"{param}.name")
    check_name(name, param=f"{param}.name")
    if not isinstance(description, str) or not description.strip():
        msg = f"{param}.description is required for an inline skill"
        raise InvalidRequest(msg, param=f"{param}.description")
    if len(description) > MAX_DESCRIPTION:
        msg = f"{param}.description is longer than {MAX_DESCRIPTION} characters"
        raise InvalidRequest(msg, param=f"{param}.description")
    if not isinstance(source, dict):
        msg = f"{param}.source is required: {{type: 'base64', media_type: 'application/zip', data}}"
        raise InvalidRequest(msg, param=f"{param}.source")
    if source.get("type") != "base64":
        msg = f"{param}.source.type must be 'base64'"
        raise InvalidRequest(msg, param=f"{param}.source.type")
    if source.get("media_type") != "application/zip":
        msg = f"{param}.source.media_type must be 'application/zip'"
        raise InvalidRequest(msg, param=f"{param}.source.media_type")
    data = source.get("data")
    if not isinstance(data, str) or not data:
        msg = f"{param}.source.data must be the skill's zip, base64-encoded"
        raise InvalidRequest(msg, param=f"{param}.source.data")
    if len(data) > (max_bytes // 3 + 1) * 4 + 4:  # before decoding anything
        msg = f"{param}.source.data is larger than the {max_bytes} bytes a skill may be"
        raise InvalidRequest(msg, param=f"{param}.source.data")
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        msg = f"{param}.source.data is not valid base64"
        raise InvalidRequest(msg, param=f"{param}.source.data") from None
    return _Inline(name, description.strip(), blob, f"{param}.source.data")


# The version a container's reference names: (principal, skill id, version, param=...).
Resolve = Callable[..., SkillVersionRecord]


class SkillMounts(ContainerFeature):
    def __init__(
        self,
        *,
        paths: SkillPaths,
        skills: SkillStore,
        container_rows: ContainerStore,
        caps: Caps,
        max_per_container: int,
        resolve: Resolve,
        runtime: Runtime,
        fetch: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        self.resolve = resolve  # ``SkillService.resolve``
        self.runtime = runtime
        # API replicas: ``SkillService.fetch``, which makes a version's files here from the
        # bundle another replica stored in the database.
        self.fetch = fetch
        self.paths = paths
        self.skills = skills
        self.containers = container_rows
        self.caps = caps
        self.max_per_container = max_per_container
        # Versions that containers being created will mount, before their rows say so.
        self._pending: dict[str, set[VersionKey]] = {}

    # -- container hooks --------------------------------------------------------------------

    async def provision(
        self, principal: Principal, req: CreateContainer, cid: str, prov: Provisioned
    ) -> None:
        if not req.skills:
            return
        if len(req.skills) > self.max_per_container:
            msg = f"a container may mount at most {self.max_per_container} skills"
            raise InvalidRequest(msg, param="skills")
        plans: list[_Reference | _Inline] = []
        for i, raw in enumerate(req.skills):
            param = f"skills[{i}]"
            kind = raw.get("type") if isinstance(raw, dict) else None
            if kind == "skill_reference":
                skill_id = raw.get("skill_id")
                if not isinstance(skill_id, str) or not skill_id:
                    msg = f"{param}.skill_id is required for a skill_reference"
                    raise InvalidRequest(msg, param=f"{param}.skill_id")
                ref = parse_version(raw.get("version"), param=f"{param}.version")
                plans.append(_Reference(self.resolve(principal, skill_id, ref, param=param)))
            elif kind == "inline":
                plans.append(_inline(raw, param, self.caps.max_bundle_bytes))
            else:
                msg = f"{param}.type must be 'skill_reference' or 'inline'"
                raise InvalidRequest(msg, param=f"{param}.type")
        seen: set[str] = set()
        for plan in plans:
            if plan.name in seen:
                msg = (
                    f"two skills in this container are named {plan.name!r}; each is mounted at "
                    f"{MOUNT_ROOT}/<name>, so their names must differ"
                )
                raise InvalidRequest(msg, param="skills")
            seen.add(plan.name)
        # No await since the lookups above: a deletion cannot slip in before this is noted.
        self._pending[cid] = {
            (p.version.skill_id, p.version.version) for p in plans if isinstance(p, _Reference)
        }
        try:
            entries, skill_mounts = await self._install(cid, plans)
        except BaseException:
            self._pending.pop(cid, None)
            await self._remove_inline(cid, [p.name for p in plans if isinstance(p, _Inline)])
            raise
        prov.skills = entries
        prov.skill_mounts.extend(skill_mounts)
        prov.files[INDEX] = json.dumps(index_document(entries), indent=2) + "\n"

    async def _install(
        self, cid: str, plans: list[_Reference | _Inline]
    ) -> tuple[list[dict[str, Any]], list[SkillMount]]:
        entries: list[dict[str, Any]] = []
        skill_mounts: list[SkillMount] = []
        for plan in plans:
            path = f"{MOUNT_ROOT}/{plan.name}"
            if isinstance(plan, _Reference):
                v = plan.version
                source = self.paths.files(v.skill_id, v.version)
                if not source.is_dir() and self.fetch is not None:
                    await self.fetch(v.skill_id, v.version)  # uploaded through another replica
                if not source.is_dir():
                    msg = f"the files of skill {v.skill_id} version {v.version} are missing"
                    raise ShellboxError(msg)
                key = runtime_key((v.skill_id, v.version))
                # (read only if the runtime lacks it: the tar is made as it is read)
                await self.runtime.install_skill(key, tar_chunks(source))
                entries.append(
                    {
                        "type": "skill_reference",
                        "name": v.name,
                        "description": v.description,
                        "skill_id": v.skill_id,
                        "version": str(v.version),
                        "path": path,
                    }
                )
            else:
                key = inline_key(cid, plan.name)
                staged = self.paths.new_staging()
                try:
                    tree = staged / "files"
                    await anyio.to_thread.run_sync(
                        partial(
                            unpack_zip,
                            io.BytesIO(plan.data),
                            len(plan.data),
                            tree,
                            self.caps,
                            param=plan.param,
                        )
                    )
                    await self.runtime.install_skill(key, tar_chunks(tree))
                finally:
                    await anyio.to_thread.run_sync(remove, staged)
                entries.append(
                    {
                        "type": "inline",
                        "name": plan.name,
                        "description": plan.description,
                        "skill_id": None,
                        "version": None,
                        "path": path,
                    }
                )
            skill_mounts.append(SkillMount(key, path))
        return entries, skill_mounts

    async def _remove_inline(self, cid: str, names: Iterable[str]) -> None:
        for name in names:
            await self.runtime.remove_skill(inline_key(cid, name))

    async def before_start(self, record: ContainerRecord) -> None:
        # The container's row (with its skills) is in the database now; it speaks for them.
        self._pending.pop(record.id, None)

    async def release(self, record: ContainerRecord) -> None:
        self._pending.pop(record.id, None)
        inline = [e["name"] for e in record.skills or [] if e.get("type") == "inline"]
        await self._remove_inline(record.id, inline)
        # (made by servers before skills crossed to the runtime by value)
        await anyio.to_thread.run_sync(remove, self.paths.container_dir(record.id))
        await self.collect(_references(record.skills), ending=record.id)

    # -- collecting -------------------------------------------------------------------------

    def _in_use(self, ending: str | None) -> set[VersionKey]:
        used: set[VersionKey] = set()
        rows = self.containers.live_skills()
        for cid, entries in rows:
            if cid != ending:
                used |= _references(entries or [])
        for cid, keys in self._pending.items():
            if cid != ending:
                used |= keys
        return used

    def _existing(self, keys: set[VersionKey]) -> set[VersionKey]:
        return self.skills.existing(keys)

    async def collect(self, keys: Iterable[VersionKey], *, ending: str | None = None) -> None:
        """Remove the unpacked files of these versions if no row and no container needs them.

        ``ending``: a container being released, whose row still says it is running."""
        candidates = set(keys)
        if not candidates:
            return
        doomed = candidates - self._existing(candidates) - self._in_use(ending)
        for skill_id, number in sorted(doomed):
            await self.runtime.remove_skill(runtime_key((skill_id, number)))
            await anyio.to_thread.run_sync(remove, self.paths.version_dir(skill_id, number))
            with contextlib.suppress(OSError):  # the last version of a deleted skill
                self.paths.skill_dir(skill_id).rmdir()

    async def collect_all(self) -> None:
        """At start-up: clear staging, unused versions, and dirs of containers that ended."""
        paths = self.paths
        for leftover in list(paths.staging.iterdir()):
            await anyio.to_thread.run_sync(remove, leftover)
        keys: set[VersionKey] = set()
        for skill_dir in list(paths.versions.iterdir()):
            for vdir in list(skill_dir.iterdir()):
                if vdir.name.isdigit():
                    keys.add((skill_dir.name, int(vdir.name)))
                else:
                    await anyio.to_thread.run_sync(remove, vdir)
        await self.collect(keys)
        for skill_dir in list(paths.versions.iterdir()):
            with contextlib.suppress(OSError):
                skill_dir.rmdir()
        live = {r.id for r in self.containers.live()}
        for cdir in list(paths.containers.iterdir()):
            if cdir.name not in live:
                await anyio.to_thread.run_sync(remove, cdir)
        # What the runtime holds that nothing needs: inline skills of containers that ended,
        # versions gone from here (deleted while this server was down).
        held: set[VersionKey] = set()
        for key in await self.runtime.skill_keys():
            first, _, rest = key.partition(".")
            if first == INLINE:
                if rest.partition(".")[0] not in live:
                    await self.runtime.remove_skill(key)
            elif rest.isdigit():
                held.add((first, int(rest)))
        gone = held - self._existing(held) - self._in_use(None)
        for version in sorted(gone):
            await self.runtime.remove_skill(runtime_key(version))


def index_document(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``GET /v1/containers/{id}/skills`` returns and ``/mnt/skills/index.json`` holds."""
    return {"object": "list", "data": entries, "has_more": False}


def _references(entries: Iterable[dict[str, Any]]) -> set[VersionKey]:
    keys: set[VersionKey] = set()
    for e in entries:
        skill_id, version = e.get("skill_id"), e.get("version")
        if isinstance(skill_id, str) and isinstance(version, str) and version.isdigit():
            keys.add((skill_id, int(version)))
    return keys
