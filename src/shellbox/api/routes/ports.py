"""Services inside containers: ``POST /v1/containers/{id}/ports/{port}/links`` makes a link,
and WebSockets to ``/v1/containers/{id}/ports/{port}/...`` (with the project's key) and
``/v1/port-links/{token}/...`` (with a link) are relayed. Plain HTTP requests to those paths
are answered before FastAPI's routing, by ``api/port_gateway.py`` (the hot path).

Everything after the port (or the token) is the service's own path, sent as the client wrote
it (still percent-encoded), with the query string; the one path the route keeps for itself is
``POST /v1/containers/{id}/ports/{port}/links`` (a service's own ``POST /links`` is reached
through a link). Pages opened through a link are answered in a CSP sandbox
(``ports.sandbox_links``): they are served from the console's own origin, and their scripts
must not be able to use an operator's console session.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from shellbox.api.deps import PrincipalDep, ServicesDep, websocket_principal
from shellbox.api.errors import deny_websocket
from shellbox.api.port_gateway import KEY_DEPTH, KEY_PREFIX, LINK_DEPTH, LINK_PREFIX
from shellbox.api.port_proxy import relay_websocket, service_path
from shellbox.api.strings import check_value, checked_params
from shellbox.errors import ShellboxError
from shellbox.service.models import Principal
from shellbox.services import Services

# No router-wide dependency: ``checked_params`` takes a Request, which WebSocket routes lack.
router = APIRouter(tags=["ports"])
CHECKED = [Depends(checked_params)]


class CreatePortLink(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_in: int | None = Field(
        None, description="seconds the link works for; default ports.link_default_s (3600)"
    )


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


@router.websocket(KEY_PREFIX + "/{path:path}")
async def port_websocket(websocket: WebSocket, container_id: str, port: int, path: str) -> None:
    services: Services = websocket.app.state.services
    try:
        for name, value in websocket.path_params.items():
            check_value(value, name)
        principal = await websocket_principal(websocket)
        prefix = KEY_PREFIX.format(container_id=container_id, port=port)
        await _relay(websocket, services, principal, container_id, port, prefix, KEY_DEPTH)
    except ShellboxError as exc:
        await deny_websocket(websocket, exc)


@router.websocket(LINK_PREFIX + "/{path:path}")
async def port_link_websocket(websocket: WebSocket, token: str, path: str) -> None:
    services: Services = websocket.app.state.services
    try:
        check_value(path, "path")
        principal, cid, port = services.ports.open_link(token)
        prefix = LINK_PREFIX.format(token=token)
        await _relay(websocket, services, principal, cid, port, prefix, LINK_DEPTH)
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
            path=service_path(websocket.scope.get("raw_path") or b"", depth),
            prefix=prefix,
            max_bytes=services.settings.ports.max_ws_message_bytes,
        )
