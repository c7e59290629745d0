"""/v1/snapshots: list, retrieve and delete a project's snapshots (taken with
``POST /v1/containers/{id}/snapshots``, forked with ``POST /v1/containers`` and
``snapshot_id``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from shellbox.api import schemas
from shellbox.api.deps import PagingDep, PrincipalDep, ServicesDep
from shellbox.api.strings import checked_params

router = APIRouter(
    prefix="/v1/snapshots", tags=["snapshots"], dependencies=[Depends(checked_params)]
)


@router.get("")
async def list_snapshots(
    principal: PrincipalDep, services: ServicesDep, paging: PagingDep
) -> JSONResponse:
    records, has_more = services.snapshots.list(
        principal, after=paging.after, limit=paging.limit, order=paging.order
    )
    return JSONResponse(schemas.page([schemas.snapshot(r) for r in records], has_more))


@router.get("/{snapshot_id}")
async def retrieve_snapshot(
    snapshot_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    return JSONResponse(schemas.snapshot(services.snapshots.get(principal, snapshot_id)))


@router.delete("/{snapshot_id}")
async def delete_snapshot(
    snapshot_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    """Delete a snapshot and its storage; containers forked from it keep their files."""
    await services.snapshots.delete(principal, snapshot_id)
    return JSONResponse(schemas.deleted(snapshot_id, "container.snapshot.deleted"))
