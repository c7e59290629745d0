"""/v1/files and /v1/containers/{id}/files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile as StarletteUploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect

from shellbox.api import schemas
from shellbox.api.deps import PagingDep, PrincipalDep, ServicesDep
from shellbox.api.idempotency import idempotent
from shellbox.api.strings import check_form, checked_request
from shellbox.errors import InvalidRequest, PayloadTooLarge
from shellbox.service.models import FileRecord, Principal
from shellbox.services import Services

router = APIRouter(prefix="/v1", tags=["files"], dependencies=[Depends(checked_request)])
CHUNK = 1 << 16


def _chunks(upload: StarletteUploadFile) -> Iterator[bytes]:
    upload.file.seek(0)
    while data := upload.file.read(CHUNK):
        yield data


async def _form(request: Request) -> Any:
    try:
        form = await request.form(max_files=1, max_fields=20)
    except StarletteHTTPException as exc:
        if exc.status_code == 413:
            raise  # the body size cap's 413
        # Starlette's own 400 for a part it cannot parse (a part header over its size limit,
        # e.g. a file name of thousands of bytes): the same client mistake as below.
        msg = f"could not parse the multipart body ({exc.detail}); check the 'file' part"
        raise InvalidRequest(msg, param="file") from None
    except (MultiPartException, ClientDisconnect) as exc:
        # A malformed body (outside an app Starlette raises its parser's error as it is), or
        # a client that left half-way: the client's doing. Anything else is a bug: a 500.
        msg = f"could not parse the multipart body: {exc}"
        raise InvalidRequest(msg, param="file") from None
    check_form(form)
    return form


@router.post("/files")
async def create_file(request: Request, principal: PrincipalDep, services: ServicesDep) -> Any:
    """Multipart: ``file`` and ``purpose`` (and optional ``expires_after[seconds]``)."""
    form = await _form(request)
    upload = form.get("file")
    if not isinstance(upload, StarletteUploadFile):
        msg = "the multipart part 'file' is required"
        raise InvalidRequest(msg, param="file")
    purpose = form.get("purpose")
    if not isinstance(purpose, str):
        msg = "the multipart field 'purpose' is required"
        raise InvalidRequest(msg, param="purpose")
    seconds: int | None = None
    raw_seconds = form.get("expires_after[seconds]")
    if isinstance(raw_seconds, str):
        try:
            seconds = int(raw_seconds)
        except ValueError:
            msg = "expires_after[seconds] must be an integer"
            raise InvalidRequest(msg, param="expires_after.seconds") from None
        if not 3600 <= seconds <= 2_592_000:
            msg = "expires_after[seconds] must be between 3600 and 2592000"
            raise InvalidRequest(msg, param="expires_after.seconds")

    async def create() -> Response:
        return JSONResponse(
            schemas.file(await _save_file(services, principal, upload, purpose, seconds))
        )

    return await idempotent(request, principal, services, create, rerun=True, form=form)


async def _save_file(
    services: Services,
    principal: Principal,
    upload: StarletteUploadFile,
    purpose: str,
    seconds: int | None,
) -> FileRecord:
    cap = services.settings.limits.upload_max_bytes
    tmp = services.files.temp_path()

    def save() -> int:
        size = 0
        with open(tmp, "wb") as out:
            for data in _chunks(upload):
                size += len(data)
                if size > cap:
                    msg = f"the upload is larger than the {cap} byte limit of this server"
                    raise PayloadTooLarge(msg, param="file")
                out.write(data)
        return size

    try:
        size = await anyio.to_thread.run_sync(save)
        record = services.files.create_file(
            principal, upload.filename or "upload", purpose, tmp, size, seconds
        )
    finally:
        if tmp.exists():
            os.unlink(tmp)
    return record


@router.get("/files")
async def list_files(
    principal: PrincipalDep,
    services: ServicesDep,
    after: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    purpose: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    records, has_more = services.files.list_files(
        principal, after=after, limit=limit, order=order, purpose=purpose
    )
    return JSONResponse(schemas.page([schemas.file(r) for r in records], has_more))


@router.get("/files/{file_id}")
async def retrieve_file(file_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    return JSONResponse(schemas.file(services.files.get_file(principal, file_id)))


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    services.files.delete_file(principal, file_id)
    return JSONResponse(schemas.deleted(file_id, "file"))


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, principal: PrincipalDep, services: ServicesDep) -> Any:
    chunks = services.files.file_content(principal, file_id)
    return StreamingResponse(chunks, media_type="application/octet-stream")


# -- container files ------------------------------------------------------------------------


@router.post("/containers/{container_id}/files")
async def create_container_file(
    container_id: str, request: Request, principal: PrincipalDep, services: ServicesDep
) -> Any:
    """Multipart ``file`` (its filename is the path under /mnt/data), or JSON ``{"file_id"}``."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        try:
            body = schemas.CreateContainerFileBody.model_validate_json(await request.body())
        except ValueError:
            msg = 'the JSON body must be {"file_id": "file-..."}'
            raise InvalidRequest(msg, param="file_id") from None
        file_id = body.file_id

        async def copy() -> Response:
            record = await services.files.upload_from_file(principal, container_id, file_id)
            return JSONResponse(schemas.container_file(record))

        return await idempotent(request, principal, services, copy, rerun=True)
    if not ctype.startswith("multipart/form-data"):
        msg = "send multipart/form-data with a 'file' part, or JSON {\"file_id\": ...}"
        raise InvalidRequest(msg, param="file")
    form = await _form(request)
    upload = form.get("file")
    if not isinstance(upload, StarletteUploadFile):
        msg = "the multipart part 'file' is required (or send JSON {\"file_id\": ...})"
        raise InvalidRequest(msg, param="file")
    filename = upload.filename or ""

    async def write() -> Response:
        record = await services.files.upload(principal, container_id, filename, _chunks(upload))
        return JSONResponse(schemas.container_file(record))

    # Writing the same bytes again is harmless, so a write cut off by a crash may rerun.
    return await idempotent(request, principal, services, write, rerun=True, form=form)


@router.get("/containers/{container_id}/files")
async def list_container_files(
    container_id: str, principal: PrincipalDep, services: ServicesDep, paging: PagingDep
) -> Any:
    records, has_more = await services.files.list_container_files(
        principal, container_id, after=paging.after, limit=paging.limit, order=paging.order
    )
    return JSONResponse(schemas.page([schemas.container_file(r) for r in records], has_more))


@router.get("/containers/{container_id}/files/{file_id}")
async def retrieve_container_file(
    container_id: str, file_id: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    record = services.files.get_container_file(principal, container_id, file_id)
    return JSONResponse(schemas.container_file(record))


@router.delete("/containers/{container_id}/files/{file_id}")
async def delete_container_file(
    container_id: str, file_id: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    await services.files.delete_container_file(principal, container_id, file_id)
    return JSONResponse(schemas.deleted(file_id, "container.file.deleted"))


@router.get("/containers/{container_id}/files/{file_id}/content")
async def container_file_content(
    container_id: str, file_id: str, principal: PrincipalDep, services: ServicesDep
) -> Any:
    chunks = await services.files.open_container_file(principal, container_id, file_id)
    return StreamingResponse(chunks, media_type="application/octet-stream")
