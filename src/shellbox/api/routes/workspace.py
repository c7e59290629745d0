"""/v1/containers/{id}/workspace: files by path and tar archives of /mnt/data (our extension,
used by the Agents SDK sandbox provider in ``shellbox.integrations.agents``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from shellbox.api.deps import PrincipalDep, ServicesDep
from shellbox.api.strings import checked_params
from shellbox.service.workspace import WorkspaceService
from shellbox.services import Services

# Bodies here are file bytes and tar archives, not text: only the parameters are checked.
router = APIRouter(
    prefix="/v1/containers/{container_id}/workspace",
    tags=["workspace"],
    dependencies=[Depends(checked_params)],
)

PathQuery = Annotated[str, Query(description="a file under /mnt/data (relative or absolute)")]
DirQuery = Annotated[
    str | None, Query(description="a directory under /mnt/data; default: /mnt/data itself")
]


def _workspace(services: Services) -> WorkspaceService:
    # Stateless and cheap: built per request rather than registered as a feature.
    return WorkspaceService(
        services.containers, services.limits, services.settings.limits.upload_max_bytes
    )


@router.get("/file")
async def read_file(
    container_id: str,
    principal: PrincipalDep,
    services: ServicesDep,
    path: PathQuery,
    max_bytes: Annotated[int | None, Query(ge=1, description="return at most this many")] = None,
) -> StreamingResponse:
    """The bytes of one regular file (symbolic links are refused)."""
    chunks = await _workspace(services).read(principal, container_id, path, max_bytes)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.get("/path")
async def resolve_path(
    container_id: str, principal: PrincipalDep, services: ServicesDep, path: PathQuery
) -> JSONResponse:
    """Where the path leads once its symbolic links are followed, as long as they stay inside
    /mnt/data; a link that leads out is a 400 with code ``path_outside_workspace``. (What an
    SDK sandbox checks before it lists, moves or removes a path with a command.)"""
    where = await _workspace(services).resolve(principal, container_id, path)
    return JSONResponse({"object": "container.workspace.path", "path": where})


@router.put("/file")
async def write_file(
    container_id: str,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    path: PathQuery,
) -> JSONResponse:
    """Replace or create one file (and its parent directories) with the request body."""
    where, size = await _workspace(services).write(principal, container_id, path, request.stream())
    return JSONResponse({"object": "container.workspace.file", "path": where, "bytes": size})


@router.get("/archive")
async def export_archive(
    container_id: str,
    principal: PrincipalDep,
    services: ServicesDep,
    path: DirQuery = None,
    exclude: Annotated[
        list[str] | None, Query(description="paths relative to the directory to leave out")
    ] = None,
) -> StreamingResponse:
    """A tar of the directory with member names relative to it (``./...``)."""
    chunks = await _workspace(services).export_archive(principal, container_id, path, exclude or [])
    return StreamingResponse(chunks, media_type="application/x-tar")


@router.put("/archive")
async def import_archive(
    container_id: str,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    path: DirQuery = None,
) -> JSONResponse:
    """Unpack the tar in the body under the directory; tar runs inside the container."""
    where, size = await _workspace(services).import_archive(
        principal, container_id, path, request.stream()
    )
    return JSONResponse({"object": "container.workspace.archive", "path": where, "bytes": size})
