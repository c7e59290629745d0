"""The operator console's session: a signed cookie, never the key itself.

Logging in with a project or admin key sets ``shellbox_console``: a token signed with the
server's key (``service/signing.py``) naming the key's id, its project, whether it is an admin
key, a random session id, and an expiry (``console.session_s``, 8 hours by default). The cookie
is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
``Path=/console`` (the API and the services reached through ports never see it), and
``Secure`` when the console is served over HTTPS. Every request checks that the key is still
active: revoking the key ends its sessions at once. The key is never stored in the browser:
not in the cookie, a URL, or localStorage.

CSRF: every form that changes something carries a token, HMAC of the session id (and fetches
send it in ``X-CSRF-Token``); and every POST must come from this origin (``Origin``, or
``Referer`` when a browser leaves it out). The login form, which has no session yet, relies on
the origin check.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from shellbox.errors import AuthenticationFailed, LinkRefused, PermissionDenied
from shellbox.service.models import Principal
from shellbox.services import Services

COOKIE = "shellbox_console"
PURPOSE = "console"
PATH = "/console"


@dataclass(frozen=True)
class Operator:
    """Who is logged in to the console."""

    project: str
    key_id: str | None
    admin: bool
    session_id: str
    csrf: str

    def principal(self, project: str | None = None) -> Principal:
        """The caller as the service sees it; an admin acts in any ``project``."""
        return Principal(project if (self.admin and project) else self.project, self.key_id)


def _csrf(services: Services, session_id: str) -> str:
    return services.signer.derive("console-csrf", session_id)


def login(services: Services, key: str, peer: str | None) -> tuple[str, int]:
    """The cookie value for a session of ``key`` and its lifetime in seconds (401 for a bad
    key, as the API answers it)."""
    principal = services.keys.authenticate(key, peer)
    admin = principal.key_id is not None and principal.key_id in services.keys.admin_ids()
    life = services.settings.console.session_s
    claims: dict[str, str | int] = {
        "k": principal.key_id or "",
        "j": principal.project,
        "a": int(admin),
        "s": secrets.token_urlsafe(16),
    }
    return services.signer.sign(PURPOSE, claims, int(time.time()) + life), life


def operator(services: Services, request: Request) -> Operator | None:
    """The logged-in operator, or None (no cookie, a bad or expired one, a revoked key)."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        claims = services.signer.verify(PURPOSE, token, what="console session")
    except LinkRefused:
        return None
    key_id, project, admin, sid = claims.get("k"), claims.get("j"), claims.get("a"), claims.get("s")
    if not (isinstance(key_id, str) and isinstance(project, str) and isinstance(sid, str)):
        return None
    if key_id:
        if not services.keys.is_active(key_id):
            return None
    else:  # open mode (no key ever made, loopback): only while it lasts
        try:
            services.keys.authenticate("open", request.client.host if request.client else None)
        except AuthenticationFailed:
            return None
    return Operator(project, key_id or None, bool(admin), sid, _csrf(services, sid))


def check_origin(request: Request) -> None:
    """Refuse a POST that another origin's page made the browser send."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None or source == "null":
        msg = "this console form must be sent from the console's own page (no Origin header)"
        raise PermissionDenied(msg)
    # Host and port only: behind a proxy that ends TLS the server sees http, the browser https.
    if urlsplit(source).netloc != request.headers.get("host", ""):
        msg = "this console form must be sent from the console's own page"
        raise PermissionDenied(msg)


def check_csrf(who: Operator, token: str | None) -> None:
    if token is None or not hmac.compare_digest(token, who.csrf):
        msg = "the console form is stale or was not sent by the console: reload the page"
        raise PermissionDenied(msg)
