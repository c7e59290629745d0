"""/v1/skills (+ versions and content) and /v1/containers/{id}/skills (our extension).

Uploads are multipart, as the openai SDK sends them: one ``files`` part holding a zip, or one
``files[]`` part per file whose filename is its path inside the skill; ``default`` comes as a
plain ``true``/``false`` field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import IO, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from shellbox.api import schemas
from shellbox.api.deps import PagingDep, PrincipalDep, ServicesDep
from shellbox.api.strings import check_form, checked_request
from shellbox.errors import InvalidRequest
from shellbox.services import Services
from shellbox.skills import SkillService
from shellbox.skills.bundle import BundleUpload, classify
from shellbox.skills.models import SkillRecord, SkillVersionRecord
from shellbox.skills.mounts import index_document

router = APIRouter(prefix="/v1", tags=["skills"], dependencies=[Depends(checked_request)])
CHUNK = 1 << 16
FILE_FIELDS = ("files", "files[]")


def _service(services: Services) -> SkillService:
    service: SkillService = services.skills
    return service


def skill_wire(r: SkillRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "object": "skill",
        "name": r.name,
        "description": r.description,
        "created_at": r.created_at,
        "default_version": str(r.default_version),
        "latest_version": str(r.latest_version),
    }


def version_wire(r: SkillVersionRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "object": "skill.version",
        "skill_id": r.skill_id,
        "version": str(r.version),
        "name": r.name,
        "description": r.description,
        "created_at": r.created_at,
    }


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@asynccontextmanager
async def _bundle_form(
    request: Request, service: SkillService
) -> AsyncIterator[tuple[BundleUpload, FormData]]:
    """Parse the multipart body into a bundle upload; the spooled parts close afterwards."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        msg = "send multipart/form-data with a 'files' zip part or 'files[]' parts"
        raise InvalidRequest(msg, param="files")
    max_files = service.caps.max_files
    try:
        form = await request.form(max_files=max_files + 1, max_fields=16)
    except (HTTPException, MultiPartException) as exc:
        detail = getattr(exc, "detail", None) or getattr(exc, "message", str(exc))
        if "Too many files" in str(detail):
            msg = f"the upload has more than {max_files} files; a skill may hold at most that many"
        else:
            msg = f"could not parse the multipart body: {detail}"
        raise InvalidRequest(msg, param="files") from None
    try:
        check_form(form)
        parts: list[tuple[str, IO[bytes]]] = []
        for key, value in form.multi_items():
            if key not in FILE_FIELDS:
                continue
            if not isinstance(value, UploadFile):
                msg = f"the '{key}' part must be a file upload"
                raise InvalidRequest(msg, param="files")
            parts.append((value.filename or "", value.file))
        yield classify(parts), form
    finally:
        await form.close()


def _flag(form: FormData, name: str) -> bool:
    raw = form.get(name)
    if raw is None:
        return False
    if isinstance(raw, str) and raw.strip().lower() in ("true", "1", "false", "0"):
        return raw.strip().lower() in ("true", "1")
    msg = f"'{name}' must be 'true' or 'false'"
    raise InvalidRequest(msg, param=name)


def _stream(f: IO[bytes]) -> Iterator[bytes]:
    try:
        while data := f.read(CHUNK):
            yield data
    finally:
        f.close()


def _zip_response(opened: tuple[IO[bytes], int, str]) -> StreamingResponse:
    f, size, filename = opened
    return StreamingResponse(
        _stream(f),
        media_type="application/zip",
        headers={
            "content-length": str(size),
            "content-disposition": f'attachment; filename="{filename}"',
        },
    )


# -- skills ---------------------------------------------------------------------------------


@router.post("/skills")
async def create_skill(request: Request, principal: PrincipalDep, services: ServicesDep) -> Any:
    service = _service(services)
    async with _bundle_form(request, service) as (upload, _):
        record = await service.create(principal, upload)
    return JSONResponse(skill_wire(record))


@router.get("/skills")
async def list_skills(principal: PrincipalDep, services: ServicesDep, paging: PagingDep) -> Any:
    records, has_more = _service(services).list_skills(
        principal, after=paging.after, limit=paging.limit, order=paging.order
    )
    return JSONResponse(_page([skill_wire(r) for r in records], has_more))


@router.get("/skills/{skill_id}")
async def retrieve_skill(skill_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    return JSONResponse(skill_wire(_service(services).get(principal, skill_id)))


@router.post("/skills/{skill_id}")
async def update_skill(
    skill_id: str,
    principal: PrincipalDep,
    services: ServicesDep,
    body: schemas.UpdateSkillBody,
) -> Any:
    record = _service(services).update(principal, skill_id, body.default_version)
    return JSONResponse(skill_wire(record))


@router.delete("/skills/{skill_id}")
async def delete_skill(skill_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    await _service(services).delete(principal, skill_id)
    return JSONResponse({"id": skill_id, "object": "skill.deleted", "deleted": True})


@router.get("/skills/{skill_id}/content")
async def skill_content(skill_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    """The default version's bundle, as a zip."""
    return _zip_response(_service(services).open_content(principal, skill_id, None))


# -- versions -------------------------------------------------------------------------------


@router.post("/skills/{skill_id}/versions")
async def create_version(
    skill_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> Any:
    service = _service(services)
    service.get(principal, skill_id)  # a 404 before parsing the upload
    async with _bundle_form(request, service) as (upload, form):
        make_default = _flag(form, "default")
        record = await service.create_version(principal, skill_id, upload, make_default)
    return JSONResponse(version_wire(record))


@router.get("/skills/{skill_id}/versions")
async def list_versions(
    skill_id: str, principal: PrincipalDep, services: ServicesDep, paging: PagingDep
) -> Any:
    records, has_more = _service(services).list_versions(
        principal, skill_id, after=paging.after, limit=paging.limit, order=paging.order
    )
    return JSONResponse(_page([version_wire(r) for r in records], has_more))


@router.get("/skills/{skill_id}/versions/{version}")
async def retrieve_version(
    skill_id: str, version: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    return JSONResponse(version_wire(_service(services).get_version(principal, skill_id, version)))


@router.delete("/skills/{skill_id}/versions/{version}")
async def delete_version(
    skill_id: str, version: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    record = await _service(services).delete_version(principal, skill_id, version)
    return JSONResponse(
        {
            "id": record.id,
            "object": "skill.version.deleted",
            "deleted": True,
            "version": str(record.version),
        }
    )


@router.get("/skills/{skill_id}/versions/{version}/content")
async def version_content(
    skill_id: str, version: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    return _zip_response(_service(services).open_content(principal, skill_id, version))


# -- containers -----------------------------------------------------------------------------


@router.get("/containers/{container_id}/skills")
async def container_skills(
    container_id: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    """What is mounted under /mnt/skills: name, description, version and path of each skill;
    the same document the container sees at /mnt/skills/index.json."""
    record = services.containers.get(principal, container_id)
    return JSONResponse(index_document(record.skills))
