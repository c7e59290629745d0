"""Services inside containers: who may reach ``127.0.0.1:PORT`` in one, and how.

A caller reaches a port with its project's key, or with a port link: a signed token scoped to
one container, one port and an expiry (and the container's project, which the lookup needs),
made by ``POST /v1/containers/{id}/ports/{port}/links``. Browsers that cannot send a key in a
header (a WebSocket) get short-lived query-string tokens, scoped to one container.
Reaching a port is using the container: it is woken when asleep and counts as activity for
as long as the connection lasts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from anyio.abc import ByteStream

from shellbox.errors import InvalidRequest, LinkRefused
from shellbox.service.containers import ContainerService
from shellbox.service.models import Principal
from shellbox.service.signing import Signer
from shellbox.settings import PortSettings

PORT_LINK = "port"
BROWSER_TOKEN = "browser"
MIN_PORT, MAX_PORT = 1, 65535


@dataclass(frozen=True)
class PortLink:
    token: str
    container_id: str
    port: int
    expires_at: int  # Unix seconds


def check_port(port: int) -> int:
    if not MIN_PORT <= port <= MAX_PORT:
        msg = f"port must be between {MIN_PORT} and {MAX_PORT}, not {port}"
        raise InvalidRequest(msg, param="port")
    return port


class PortService:
    def __init__(
        self, settings: PortSettings, containers: ContainerService, signer: Signer
    ) -> None:
        self.settings = settings
        self.containers = containers
        self.signer = signer

    # -- links ------------------------------------------------------------------------------

    def create_link(
        self, principal: Principal, cid: str, port: int, expires_in: int | None = None
    ) -> PortLink:
        """A link to the port, for ``expires_in`` seconds (default ``ports.link_default_s``,
        at most ``ports.link_max_s``). The container must be the caller's and live."""
        check_port(port)
        if expires_in is None:
            expires_in = self.settings.link_default_s
        if not 1 <= expires_in <= self.settings.link_max_s:
            msg = (
                f"expires_in must be between 1 and {self.settings.link_max_s} seconds "
                f"(ports.link_max_s), not {expires_in}"
            )
            raise InvalidRequest(msg, param="expires_in")
        record = self.containers.get_live(principal, cid)
        expires_at = int(self.signer.clock()) + expires_in
        claims: dict[str, str | int] = {"c": record.id, "o": port, "j": record.project}
        token = self.signer.sign(PORT_LINK, claims, expires_at)
        return PortLink(token, record.id, port, expires_at)

    def open_link(self, token: str) -> tuple[Principal, str, int]:
        """The project, container and port a link reaches (``LinkRefused`` otherwise)."""
        claims = self.signer.verify(PORT_LINK, token, what="port link")
        cid, port, project = claims.get("c"), claims.get("o"), claims.get("j")
        if not (isinstance(cid, str) and isinstance(port, int) and isinstance(project, str)):
            msg = "this port link is not valid; ask for a new one"
            raise LinkRefused(msg)
        return Principal(project), cid, port

    # -- browsers' query-string tokens ----------------------------------------------------

    def browser_token(self, principal: Principal, cid: str) -> str:
        """A token standing for ``principal`` on one container's routes (the PTY's WebSocket)
        for ``ports.browser_token_s``: a browser cannot put a key in a WebSocket's headers."""
        record = self.containers.get_live(principal, cid)
        claims = {"c": record.id, "j": record.project, "k": principal.key_id or ""}
        expires_at = int(time.time()) + self.settings.browser_token_s
        return self.signer.sign(BROWSER_TOKEN, claims, expires_at)

    def principal_for_token(self, token: str, cid: str) -> Principal:
        claims = self.signer.verify(BROWSER_TOKEN, token, what="browser token")
        project, key_id = claims.get("j"), claims.get("k")
        if claims.get("c") != cid or not isinstance(project, str):
            msg = f"this browser token is not for container {cid}"
            raise LinkRefused(msg)
        return Principal(project, key_id if isinstance(key_id, str) and key_id else None)

    # -- connections ------------------------------------------------------------------------

    @asynccontextmanager
    async def connect(self, principal: Principal, cid: str, port: int) -> AsyncIterator[ByteStream]:
        """A connection to ``127.0.0.1:port`` in the caller's container, woken if asleep and
        kept from sleeping while the connection lasts."""
        check_port(port)
        async with self.containers.activity(principal, cid) as record:
            stream = await self.containers.runtime.connect_port(record.id, port)
            try:
                yield stream
            finally:
                await stream.aclose()
