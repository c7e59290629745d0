"""``/console``: the operator console's pages (``pages.py``) and the few actions behind them.

A page without a session redirects to the login form. Failures of the service (a container
that is not the operator's, a bad port) are shown as an HTML page with the same status the API
would give. Every page is sent with a strict Content-Security-Policy (scripts and connections
to this origin only, no frames) and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Header, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse
from starlette.staticfiles import StaticFiles

from shellbox.api.console import pages, session
from shellbox.api.console.session import COOKIE, PATH, Operator
from shellbox.api.deps import ServicesDep, peer_host
from shellbox.api.routes.ports import link_url
from shellbox.errors import InvalidRequest, ShellboxError
from shellbox.service.usage_report import ReportRequest, build
from shellbox.services import Services
from shellbox.store.records import ContainerRecord

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_LISTED = 500
MAX_EGRESS_SHOWN = 50
MAX_FILES_SHOWN = 100
USAGE_DAYS = 7
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

router = APIRouter(prefix=PATH, include_in_schema=False)
static = StaticFiles(directory=STATIC_DIR)


def html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)


def to_login() -> RedirectResponse:
    return RedirectResponse(f"{PATH}/login", status_code=303)


def _page(request: Request, services: Services, render: Callable[[Operator], str]) -> Response:
    who = session.operator(services, request)
    if who is None:
        return to_login()
    try:
        return html(render(who))
    except ShellboxError as exc:
        return html(pages.error_page(who, exc.status, exc.message), exc.status)


def _container(services: Services, who: Operator, cid: str) -> ContainerRecord:
    """The container, if the operator may see it (an admin: any project's)."""
    if who.admin:
        return services.containers.find(cid)
    return services.containers.get(who.principal(), cid)


@router.get("")
async def containers(request: Request, services: ServicesDep) -> Response:
    who = session.operator(services, request)
    if who is None:
        return to_login()
    if who.admin:
        records = services.containers.list_all(MAX_LISTED)
    else:
        records, _ = services.containers.list(who.principal(), after=None, limit=100, order="desc")
        records = [r for r in records if r.status != "deleted"]
    memory = await services.containers.memory_usage(records)
    return html(pages.containers_page(who, records, memory))


@router.get("/login")
async def login_form(request: Request, services: ServicesDep) -> Response:
    if session.operator(services, request) is not None:
        return RedirectResponse(PATH, status_code=303)
    return html(pages.login_page())


@router.post("/login")
async def login(
    request: Request, services: ServicesDep, key: Annotated[str, Form()] = ""
) -> Response:
    session.check_origin(request)
    try:
        token, life = session.login(services, key, peer_host(request))
    except ShellboxError as exc:
        return html(pages.login_page(exc.message), exc.status)
    response = RedirectResponse(PATH, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=life,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(
    request: Request, services: ServicesDep, csrf: Annotated[str, Form()] = ""
) -> Response:
    session.check_origin(request)
    who = session.operator(services, request)
    if who is not None:
        session.check_csrf(who, csrf)
    response = to_login()
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")
    return response


async def _container_page(
    request: Request,
    services: Services,
    who: Operator,
    cid: str,
    new_link: pages.NewLink | None = None,
    link_error: str | None = None,
    status: int = 200,
) -> Response:
    try:
        record = _container(services, who, cid)
        principal = who.principal(record.project)
        files, _ = await services.files.list_container_files(
            principal, cid, after=None, limit=MAX_FILES_SHOWN, order="asc"
        )
        events, _ = services.egress.events(cid, after=None, limit=MAX_EGRESS_SHOWN, order="desc")
        used = (await services.containers.memory_usage([record])).get(cid)
    except ShellboxError as exc:
        return html(pages.error_page(who, exc.status, exc.message), exc.status)
    text = pages.container_page(who, record, used, files, events, new_link, link_error)
    return html(text, status)


@router.get("/containers/{cid}")
async def container(cid: str, request: Request, services: ServicesDep) -> Response:
    who = session.operator(services, request)
    if who is None:
        return to_login()
    return await _container_page(request, services, who, cid)


@router.post("/containers/{cid}/links")
async def create_link(
    cid: str,
    request: Request,
    services: ServicesDep,
    csrf: Annotated[str, Form()] = "",
    port: Annotated[str, Form()] = "",
    expires_in: Annotated[str, Form()] = "3600",
) -> Response:
    session.check_origin(request)
    who = session.operator(services, request)
    if who is None:
        return to_login()
    session.check_csrf(who, csrf)
    try:
        if not port.strip().isdigit() or not expires_in.strip().isdigit():
            msg = "port and lifetime must be whole numbers"
            raise InvalidRequest(msg, param="port")
        record = _container(services, who, cid)
        link = services.ports.create_link(
            who.principal(record.project), cid, int(port), int(expires_in)
        )
    except ShellboxError as exc:
        return await _container_page(
            request, services, who, cid, link_error=exc.message, status=exc.status
        )
    new = pages.NewLink(link_url(request, link.token), link.port, link.expires_at)
    return await _container_page(request, services, who, cid, new_link=new)


@router.post("/containers/{cid}/pty-token")
async def pty_token(
    cid: str,
    request: Request,
    services: ServicesDep,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> Response:
    """A short-lived token for the terminal's WebSocket (a browser cannot send a key there)."""
    session.check_origin(request)
    who = session.operator(services, request)
    if who is None:
        return JSONResponse({"error": {"message": "log in again"}}, status_code=401)
    session.check_csrf(who, x_csrf_token)
    record = _container(services, who, cid)
    token = services.ports.browser_token(who.principal(record.project), cid)
    expires_at = int(time.time()) + services.settings.ports.browser_token_s
    return JSONResponse(
        {"token": token, "expires_at": expires_at}, headers={"cache-control": "no-store"}
    )


@router.get("/containers/{cid}/files/{file_id}")
async def download(cid: str, file_id: str, request: Request, services: ServicesDep) -> Response:
    who = session.operator(services, request)
    if who is None:
        return to_login()
    try:
        record = _container(services, who, cid)
        principal = who.principal(record.project)
        meta = services.files.get_container_file(principal, cid, file_id)
        chunks = await services.files.open_container_file(principal, cid, file_id)
    except ShellboxError as exc:
        return html(pages.error_page(who, exc.status, exc.message), exc.status)
    name = meta.path.rsplit("/", 1)[-1]
    disposition = f"attachment; filename*=UTF-8''{quote(name, safe='')}"
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={
            "content-disposition": disposition,
            "x-content-type-options": "nosniff",
            "cache-control": "no-store",
        },
    )


@router.get("/usage")
async def usage(request: Request, services: ServicesDep) -> Response:
    def render(who: Operator) -> str:
        if not who.admin:
            services.keys.require_admin(who.principal())
        now = int(time.time())
        req = ReportRequest(
            start_time=now - USAGE_DAYS * 86400, bucket_width="1d", group_by=("project_id",)
        )
        sessions = build(services.metering, req, "sessions")
        costs = build(services.metering, req, "costs")
        days: dict[tuple[int, str], dict[str, object]] = {}
        totals: dict[str, tuple[int, float]] = {}

        def day(bucket: dict[str, Any], res: dict[str, Any]) -> dict[str, object]:
            """One project's row of one day, made on first sight (with no sessions, no cost)."""
            start, project = bucket["start_time"], res["project_id"]
            return days.setdefault(
                (start, project),
                {"start_time": start, "project": project, "sessions": 0, "cost": 0.0},
            )

        for bucket in sessions["data"]:
            for res in bucket["results"]:
                day(bucket, res)["sessions"] = res["num_sessions"]
        for bucket in costs["data"]:
            for res in bucket["results"]:
                day(bucket, res)["cost"] = res["amount"]["value"]
        for row in days.values():
            n, c = totals.get(str(row["project"]), (0, 0.0))
            totals[str(row["project"])] = (
                n + int(str(row["sessions"])),
                c + float(str(row["cost"])),
            )
        ordered = [days[k] for k in sorted(days, reverse=True)]
        return pages.usage_page(
            who, ordered, totals, services.settings.metering.price_per_second_usd
        )

    return _page(request, services, render)
