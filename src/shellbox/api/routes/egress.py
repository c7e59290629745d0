"""/v1/containers/{id}/egress: the container's egress audit, newest first by default."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from shellbox.api import schemas
from shellbox.api.deps import PagingDep, PrincipalDep, ServicesDep
from shellbox.api.strings import checked_params

router = APIRouter(prefix="/v1/containers", tags=["egress"], dependencies=[Depends(checked_params)])


@router.get("/{container_id}/egress")
async def list_egress_events(
    container_id: str, principal: PrincipalDep, services: ServicesDep, paging: PagingDep
) -> JSONResponse:
    """Every attempt the container made through the egress proxy (method, host, port, path
    without query, allowed or refused, status, bytes). Never headers, bodies or secrets."""
    services.containers.get(principal, container_id)  # 404 unless the caller's project owns it
    events, has_more = services.egress.events(
        container_id, after=paging.after, limit=paging.limit, order=paging.order
    )
    return JSONResponse(schemas.page(events, has_more))
