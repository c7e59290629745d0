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
    shown = [schemas.snapshot(r, services.snapshots.expires_at(r)) for r in records]
    return JSONResponse(schemas.page(shown, has_more))


@router.get("/{snapshot_id}")
async def retrieve_snapshot(
    snapshot_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    record = services.snapshots.get(principal, snapshot_id)
    return JSONResponse(schemas.snapshot(record, services.snapshots.expires_at(record)))


@router.delete("/{snapshot_id}")
async def delete_snapshot(
    snapshot_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    """Delete a snapshot and its storage; containers forked from it keep their files (and its
    bytes count against the project's snapshot quota until the last of them is gone)."""
    await services.snapshots.delete(principal, snapshot_id)
    return JSONResponse(schemas.deleted(snapshot_id, "container.snapshot.deleted"))
