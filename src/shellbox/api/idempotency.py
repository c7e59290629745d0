"""The ``Idempotency-Key`` header on the create routes (see ``service.idempotency``).

A request is identified by its route (method and path, ids included), its query and its body:
JSON bodies by their bytes' SHA-256 (a retry sends the same bytes), multipart bodies by their
fields, file names and file contents' SHA-256 (the framing's boundary differs per send). A
replayed answer carries ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import Response
from starlette.datastructures import FormData, UploadFile

from shellbox.api.json_body import BODY_SHA256
from shellbox.service.idempotency import (
    HEADER,
    Begun,
    Claim,
    IdempotencyService,
    Stored,
    check_key,
    current_claim,
)
from shellbox.service.models import Principal
from shellbox.services import Services

REPLAYED = {"idempotent-replayed": "true"}


def service(services: Services) -> IdempotencyService:
    return services.idempotency


def request_key(request: Request) -> str | None:
    raw = request.headers.get(HEADER)
    return None if raw is None else check_key(raw)


def _file_digest(upload: UploadFile) -> str:
    digest = hashlib.sha256()
    upload.file.seek(0)
    while data := upload.file.read(1 << 16):
        digest.update(data)
    upload.file.seek(0)
    return digest.hexdigest()


async def fingerprint(request: Request, form: FormData | None = None) -> str:
    parts: list[Any] = [sorted(request.query_params.multi_items())]
    if form is not None:
        fields: list[tuple[str, Any]] = []
        for k, v in form.multi_items():
            if isinstance(v, UploadFile):  # spooled, maybe to disk: hashed in a thread
                fields.append((k, [v.filename, await anyio.to_thread.run_sync(_file_digest, v)]))
            else:
                fields.append((k, v))
        parts.append(sorted(fields, key=lambda kv: kv[0]))
    else:
        digest = getattr(request.state, BODY_SHA256, None)  # a body the route read itself
        parts.append(digest or hashlib.sha256(await request.body()).hexdigest())
    canonical = json.dumps(parts, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(stored: Stored) -> Response:
    return Response(
        stored.body, status_code=stored.status, media_type=stored.content_type, headers=REPLAYED
    )


async def begin(
    request: Request,
    principal: Principal,
    services: Services,
    key: str,
    *,
    rerun: bool,
    form: FormData | None = None,
) -> Begun:
    route = f"{request.method} {request.url.path}"
    return service(services).begin(
        principal, key, route, await fingerprint(request, form), rerun=rerun
    )


async def idempotent(
    request: Request,
    principal: Principal,
    services: Services,
    work: Callable[[], Awaitable[Response]],
    *,
    rerun: bool,
    form: FormData | None = None,
    resume: Callable[[str], Response | None] | None = None,
) -> Response:
    """Run ``work`` once per key: without the header it just runs; with it, a retry gets the
    first success back. ``rerun``: whether work cut off by a crash may run again (``resume``
    first offers the resource the cut-off attempt had started, when it recorded one)."""
    key = request_key(request)
    if key is None:
        return await work()
    begun = await begin(request, principal, services, key, rerun=rerun, form=form)
    if begun.replay is not None:
        return replay(begun.replay)
    assert begun.claim is not None
    idem = service(services)
    try:
        response = None
        if begun.interrupted_resource is not None and resume is not None:
            response = resume(begun.interrupted_resource)
        if response is None:
            response = await _under(begun.claim, work)
    except BaseException:
        idem.release(begun.claim)
        raise
    if response.status_code < 400:
        stored = Stored(response.status_code, response.media_type or "", bytes(response.body))
        idem.finish(begun.claim, stored)
    else:
        idem.release(begun.claim)
    return response


async def _under(claim: Claim, work: Callable[[], Awaitable[Response]]) -> Response:
    token = current_claim.set(claim)
    try:
        return await work()
    finally:
        current_claim.reset(token)
