"""/v1/responses: the Responses API, with shell calls run server-side (see shellbox.responses).

A non-streamed answer carries a ``Server-Timing`` header: ``upstream`` (waiting for the
model), ``exec`` (commands running) and ``total``, in milliseconds; what is left is
shellbox's own overhead.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from shellbox.api import schemas
from shellbox.api.deps import PrincipalDep, ServicesDep
from shellbox.api.idempotency import idempotent
from shellbox.api.strings import checked_request
from shellbox.responses.events import sse
from shellbox.responses.loop import Run
from shellbox.responses.request import parse_response_request
from shellbox.responses.service import ResponsesService
from shellbox.services import Services

router = APIRouter(
    prefix="/v1/responses", tags=["responses"], dependencies=[Depends(checked_request)]
)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def responses_service(services: Services) -> ResponsesService:
    service: ResponsesService = services.responses
    return service


def server_timing(run: Run, started_ns: int) -> str:
    parts = [f"{name};dur={ms:.3f}" for name, ms in run.timings().items()]
    parts.append(f"total;dur={(time.perf_counter_ns() - started_ns) / 1e6:.3f}")
    return ", ".join(parts)


def stream(run: Run) -> StreamingResponse:
    events = run.client_events()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield sse(event)
        finally:
            await events.aclose()  # a client that left: the running command is killed

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("")
async def create_response(
    request: Request,
    principal: PrincipalDep,
    services: ServicesDep,
    body: schemas.ResponseRequestBody,
) -> Any:
    started = time.perf_counter_ns()
    parsed, streamed = parse_response_request(body.model_dump(exclude_unset=True))
    service = responses_service(services)
    if streamed:
        # Idempotency-Key is not kept for streams: the response is stored under its id
        # (``store``), which a client that lost the stream can retrieve.
        return stream(await service.create_run(principal, parsed, id_prefix="resp_"))

    async def result() -> Response:
        run = await service.create_run(principal, parsed, id_prefix="resp_")
        response = await run.result()
        return JSONResponse(response, headers={"server-timing": server_timing(run, started)})

    return await idempotent(request, principal, services, result, rerun=False)


@router.get("/{response_id}")
async def retrieve_response(
    response_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    return JSONResponse(responses_service(services).get(principal, response_id))


@router.delete("/{response_id}")
async def delete_response(
    response_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    responses_service(services).delete(principal, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
