"""/v1/organization/usage/code_interpreter_sessions, /v1/organization/costs (admin keys only:
the shapes of ``service.usage_report``) and /metrics (Prometheus; an admin key, or a loopback
peer).

List parameters come as the openai SDK sends them (``group_by[]=project_id``) or repeated
plainly (``group_by=project_id``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shellbox.api.deps import PrincipalDep, ServicesDep, bearer_auth, peer_host
from shellbox.api.strings import checked_params
from shellbox.service.keys import is_loopback
from shellbox.service.usage_report import Report, ReportRequest, build

router = APIRouter(tags=["organization"], dependencies=[Depends(checked_params)])


def _many(request: Request, name: str) -> tuple[str, ...]:
    q = request.query_params
    return tuple(q.getlist(name) + q.getlist(f"{name}[]"))


def _report(
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    report: Report,
    start_time: int,
    end_time: int | None,
    bucket_width: str,
    limit: int | None,
    page: str | None,
) -> JSONResponse:
    services.keys.require_admin(principal)
    req = ReportRequest(
        start_time=start_time,
        end_time=end_time,
        bucket_width=bucket_width,
        group_by=_many(request, "group_by"),
        project_ids=_many(request, "project_ids"),
        line_items=_many(request, "line_items"),
        api_key_ids=_many(request, "api_key_ids") if report == "costs" else (),
        limit=limit,
        page=page,
    )
    return JSONResponse(build(services.metering, req, report))


StartTime = Annotated[int, Query(description="Unix seconds, inclusive")]
EndTime = Annotated[int | None, Query(description="Unix seconds, exclusive (default: now)")]
Limit = Annotated[int | None, Query(description="buckets per page")]
Page = Annotated[str | None, Query(description="next_page of the previous answer")]


@router.get("/v1/organization/usage/code_interpreter_sessions")
async def code_interpreter_sessions(
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    start_time: StartTime,
    end_time: EndTime = None,
    bucket_width: Annotated[str, Query(description="1m, 1h or 1d")] = "1d",
    limit: Limit = None,
    page: Page = None,
) -> JSONResponse:
    """Containers used (a container is a session), per bucket, as OpenAI's usage API."""
    return _report(
        request, principal, services, "sessions", start_time, end_time, bucket_width, limit, page
    )


@router.get("/v1/organization/costs")
async def costs(
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    start_time: StartTime,
    end_time: EndTime = None,
    bucket_width: Annotated[str, Query(description="1d")] = "1d",
    limit: Limit = None,
    page: Page = None,
) -> JSONResponse:
    """Billed sandbox time in US dollars per day, as OpenAI's costs API."""
    return _report(
        request, principal, services, "costs", start_time, end_time, bucket_width, limit, page
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_auth)],
) -> Response:
    peer = peer_host(request)
    if peer is None or not is_loopback(peer):
        token = credentials.credentials if credentials else None
        services.keys.require_admin(services.keys.authenticate(token, peer))
    body = generate_latest(services.metering.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
