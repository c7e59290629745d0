"""Dependencies the routes share: the caller's principal, the services, paging params.

All are ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a thread
hop per dependency per request that costs more than the work they do (the key lookup is a
short local query or a cache hit, as the store's note explains)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Query, Request, Security, WebSocket
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from shellbox.service.models import Principal
from shellbox.services import Services


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


# Documents the scheme in /openapi.json (the SDK names it bearer_auth); auto_error is off so
# that a missing or malformed header gets our own 401 envelope.
bearer_auth = HTTPBearer(auto_error=False, scheme_name="bearer_auth")


async def get_principal(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_auth)],
) -> Principal:
    return services.keys.authenticate(
        credentials.credentials if credentials else None, peer_host(request)
    )


def bearer_credential(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (None for any other scheme), as
    FastAPI's ``HTTPBearer`` reads it for the other routes."""
    scheme, _, token = (authorization or "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def key_principal(conn: HTTPConnection, services: Services) -> Principal:
    """The caller of a request or WebSocket read outside FastAPI's dependencies (the port
    gateway, the WebSocket routes): its ``Authorization: Bearer`` key, as ``get_principal``
    reads it."""
    credential = bearer_credential(conn.headers.get("authorization"))
    return services.keys.authenticate(credential, peer_host(conn))


def peer_host(conn: HTTPConnection) -> str | None:
    """The address the request came from (None when the server cannot tell)."""
    return conn.client.host if conn.client else None


async def websocket_principal(websocket: WebSocket, *, browser_token: bool = False) -> Principal:
    """The caller of a WebSocket route, before it is accepted: the Bearer key of its
    ``Authorization`` header, as every route takes it, or (``browser_token``: the routes of one
    container that a browser opens, the PTY) a short-lived ``?token=`` the console hands out
    (``PortService.browser_token``), valid for that container only. The one place a
    WebSocket's credential is read. Raises ``AuthenticationFailed``; the route answers it as an
    HTTP error before the upgrade."""
    services: Services = websocket.app.state.services
    query_token = websocket.query_params.get("token") if browser_token else None
    if query_token is not None and "authorization" not in websocket.headers:
        cid = str(websocket.path_params.get("container_id", ""))
        return services.ports.principal_for_token(query_token, cid)
    return key_principal(websocket, services)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


@dataclass(frozen=True)
class Paging:
    after: str | None
    limit: int
    order: Literal["asc", "desc"]


async def paging(
    after: Annotated[str | None, Query(description="id of the previous page's last item")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> Paging:
    return Paging(after, limit, order)


PagingDep = Annotated[Paging, Depends(paging)]
