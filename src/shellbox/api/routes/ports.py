"""Services inside containers: ``/v1/containers/{id}/ports/{port}/...`` with the project's key,
``/v1/port-links/{token}/...`` with a link, and ``POST .../ports/{port}/links`` to make one.

Everything after the port (or the token) is the service's own path, sent as the client wrote
it (still percent-encoded), with the query string; the one path the route keeps for itself is
``POST /v1/containers/{id}/ports/{port}/links`` (a service's own ``POST /links`` is reached
through a link). Pages opened through a link are answered in a CSP sandbox
(``ports.sandbox_links``): they are served from the console's own origin, and their scripts
must not be able to use an operator's console session.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from shellbox.api.deps import PrincipalDep, ServicesDep, websocket_principal
from shellbox.api.errors import deny_websocket
from shellbox.api.port_proxy import forward_http, relay_websocket
from shellbox.api.strings import check_value, checked_params
from shellbox.errors import ShellboxError
from shellbox.service.models import Principal
from shellbox.services import Services

# No router-wide dependency: ``checked_params`` takes a Request, which WebSocket routes lack.
router = APIRouter(tags=["ports"])
CHECKED = [Depends(checked_params)]

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SANDBOX_CSP = (
    b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
    b"allow-pointer-lock allow-presentation"
)
KEY_PREFIX = "/v1/containers/{container_id}/ports/{port}"
LINK_PREFIX = "/v1/port-links/{token}"


class CreatePortLink(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_in: int | None = Field(
        None, description="seconds the link works for; default ports.link_default_s (3600)"
    )


def _service_path(raw_path: bytes, depth: int) -> str:
    """What follows the route's own ``depth`` path segments, as the client sent it."""
    parts = raw_path.split(b"/", depth + 1)
    rest = parts[depth + 1] if len(parts) > depth + 1 else b""
    return "/" + rest.decode("latin-1")


def link_url(request: Request, token: str) -> str:
    return str(request.base_url).rstrip("/") + LINK_PREFIX.format(token=token) + "/"


@router.post(KEY_PREFIX + "/links", dependencies=CHECKED)
async def create_port_link(
    container_id: str,
    port: int,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    body: Annotated[CreatePortLink | None, Body()] = None,
) -> JSONResponse:
    """A URL that opens the port's service without a key until ``expires_at``."""
    expires_in = body.expires_in if body is not None else None
    link = services.ports.create_link(principal, container_id, port, expires_in)
    return JSONResponse(
        {
            "object": "container.port_link",
            "container_id": link.container_id,
            "port": link.port,
            "url": link_url(request, link.token),
            "expires_at": link.expires_at,
        }
    )


async def _forward(
    request: Request,
    services: Services,
    principal: Principal,
    cid: str,
    port: int,
    prefix: str,
    depth: int,
    link: bool,
) -> Response:
    settings = services.settings.ports
    cleanup = AsyncExitStack()
    try:
        stream = await cleanup.enter_async_context(services.ports.connect(principal, cid, port))
        return await forward_http(
            request,
            stream,
            cleanup,
            port=port,
            path=_service_path(request.scope.get("raw_path") or b"", depth),
            prefix=prefix,
            head_timeout_s=settings.head_timeout_s,
            extra_headers=[(b"content-security-policy", SANDBOX_CSP)]
            if link and settings.sandbox_links
            else (),
        )
    except BaseException:  # the response owns ``cleanup`` only once it exists
        await cleanup.aclose()
        raise


@router.api_route(KEY_PREFIX, methods=METHODS, include_in_schema=False, dependencies=CHECKED)
@router.api_route(LINK_PREFIX, methods=METHODS, include_in_schema=False, dependencies=CHECKED)
async def port_root(request: Request) -> Response:
    """The service's root is ``.../`` (so that its relative links resolve under it)."""
    url = request.url.replace(path=request.url.path + "/")
    return RedirectResponse(str(url), status_code=307)


# The services' own answers (any status, any body) are not this API's to document.
@router.api_route(
    KEY_PREFIX + "/{path:path}", methods=METHODS, dependencies=CHECKED, include_in_schema=False
)
async def port_request(
    container_id: str,
    port: int,
    path: str,
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
) -> Response:
    """The HTTP service on ``127.0.0.1:{port}`` in the container: the request as sent (the
    key left out), the answer streamed back."""
    prefix = KEY_PREFIX.format(container_id=container_id, port=port)
    return await _forward(request, services, principal, container_id, port, prefix, 5, False)


@router.api_route(
    LINK_PREFIX + "/{path:path}", methods=METHODS, dependencies=CHECKED, include_in_schema=False
)
async def port_link_request(
    token: str, path: str, request: Request, services: ServicesDep
) -> Response:
    """The same, for whoever holds a port link (no key)."""
    principal, cid, port = services.ports.open_link(token)
    prefix = LINK_PREFIX.format(token=token)
    return await _forward(request, services, principal, cid, port, prefix, 3, True)


@router.websocket(KEY_PREFIX + "/{path:path}")
async def port_websocket(websocket: WebSocket, container_id: str, port: int, path: str) -> None:
    services: Services = websocket.app.state.services
    try:
        for name, value in websocket.path_params.items():
            check_value(value, name)
        principal = await websocket_principal(websocket)
        prefix = KEY_PREFIX.format(container_id=container_id, port=port)
        await _relay(websocket, services, principal, container_id, port, prefix, 5)
    except ShellboxError as exc:
        await deny_websocket(websocket, exc)


@router.websocket(LINK_PREFIX + "/{path:path}")
async def port_link_websocket(websocket: WebSocket, token: str, path: str) -> None:
    services: Services = websocket.app.state.services
    try:
        check_value(path, "path")
        principal, cid, port = services.ports.open_link(token)
        prefix = LINK_PREFIX.format(token=token)
        await _relay(websocket, services, principal, cid, port, prefix, 3)
    except ShellboxError as exc:
        await deny_websocket(websocket, exc)


async def _relay(
    websocket: WebSocket,
    services: Services,
    principal: Principal,
    cid: str,
    port: int,
    prefix: str,
    depth: int,
) -> None:
    async with services.ports.connect(principal, cid, port) as stream:
        await relay_websocket(
            websocket,
            stream,
            port=port,
            path=_service_path(websocket.scope.get("raw_path") or b"", depth),
            prefix=prefix,
            max_bytes=services.settings.ports.max_ws_message_bytes,
        )
