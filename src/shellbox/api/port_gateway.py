"""The port routes' HTTP requests, answered before FastAPI's routing.

``/v1/containers/{id}/ports/{port}/...`` (with the project's key) and
``/v1/port-links/{token}/...`` (with a link) carry every request a person's browser or a
client makes to a service in a container, so their cost is the proxy's overhead on each one
(``bench/bench_ports.py``, goal <= 1 ms). Going through FastAPI cost about half of it:
matching the path against every route of the API, then the dependency machinery, the
exception and exit-stack layers, each wrapping every send. This pure ASGI middleware sits
inside the request-context middleware (so the request id and the upload cap still apply)
and answers these paths itself, with the same checks the routes made: the strings of the
path and query, the key (or the link's signature), the container's project, then
``forward_http``. Errors are the same envelope (``error_response``); anything unexpected
goes on to the outer middleware's 500 with a log line.

Left to FastAPI: ``POST .../ports/{port}/links`` (a documented route with a JSON body) and
WebSocket upgrades (one per connection: ``routes/ports.py``).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from shellbox.api.deps import key_principal
from shellbox.api.errors import envelope, error_response
from shellbox.api.middleware import is_port_path
from shellbox.api.port_proxy import forward_http, service_path
from shellbox.api.strings import check_value
from shellbox.errors import InvalidRequest, ShellboxError
from shellbox.service.models import Principal
from shellbox.service.ports import check_port
from shellbox.services import Services

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# What a page opened through a link may do: it is served from the console's own origin, and
# its scripts must not be able to use an operator's console session.
SANDBOX_CSP = (
    b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
    b"allow-pointer-lock allow-presentation"
)
KEY_PREFIX = "/v1/containers/{container_id}/ports/{port}"
LINK_PREFIX = "/v1/port-links/{token}"
KEY_DEPTH, LINK_DEPTH = 5, 3  # path segments before the service's own path


class PortGateway:
    """Answers the port routes' HTTP requests (see the module); passes the rest on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_port_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        parts = path.split("/", KEY_DEPTH + 1)
        if (
            len(parts) == KEY_DEPTH + 2
            and parts[6] == "links"
            and parts[2] == "containers"
            and scope["method"] == "POST"
        ):  # the route that makes links
            await self.app(scope, receive, send)
            return
        depth = LINK_DEPTH if path.startswith("/v1/port-links/") else KEY_DEPTH
        response: Response
        if scope["method"] not in METHODS:
            response = envelope(405, "This route does not accept that HTTP method")
        else:
            request = Request(scope, receive)
            try:
                response = await self._answer(request, scope["app"].state.services, parts, depth)
            except ShellboxError as exc:
                response = error_response(exc)
        await response(scope, receive, send)

    async def _answer(
        self, request: Request, services: Services, parts: list[str], depth: int
    ) -> Response:
        for name, value in request.query_params.multi_items():
            check_value(value, name)
        link = depth == LINK_DEPTH
        if link:
            token = parts[3]
            check_value(token, "token")
            principal, cid, port = services.ports.open_link(token)
            prefix = LINK_PREFIX.format(token=token)
        else:
            cid = parts[3]
            check_value(cid, "container_id")
            port = _port(parts[5])
            prefix = KEY_PREFIX.format(container_id=cid, port=port)
        if len(parts) == depth + 1:
            # The service's root is ``.../`` (so that its relative links resolve under it).
            return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), 307)
        check_value(request.scope["path"], "path")
        if not link:
            principal = key_principal(request, services)
        return await self._forward(request, services, principal, cid, port, prefix, depth, link)

    @staticmethod
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
                path=service_path(request.scope.get("raw_path") or b"", depth),
                prefix=prefix,
                head_timeout_s=settings.head_timeout_s,
                extra_headers=[(b"content-security-policy", SANDBOX_CSP)]
                if link and settings.sandbox_links
                else (),
            )
        except BaseException:  # the response owns ``cleanup`` only once it exists
            await cleanup.aclose()
            raise


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5):
        msg = f"port must be a whole number between 1 and 65535, not {text!r}"
        raise InvalidRequest(msg, param="port")
    return check_port(int(text))
