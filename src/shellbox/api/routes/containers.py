"""/v1/containers and /v1/containers/{id}/calls."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from shellbox.api import schemas
from shellbox.api.deps import PagingDep, PrincipalDep, ServicesDep
from shellbox.api.errors import invalid_request
from shellbox.api.idempotency import REPLAYED, begin, idempotent, request_key
from shellbox.api.idempotency import service as idempotency_service
from shellbox.api.json_body import read_json_object
from shellbox.api.strings import check_value, checked_params, checked_request
from shellbox.errors import InvalidRequest, NotFound, ShellboxError
from shellbox.service.containers import CreateContainer
from shellbox.service.idempotency import Stored

# Every route's parameters are checked first; JSON bodies too, by ``checked_request`` where
# FastAPI parses the body, and by the calls route itself, which reads its (large) body once.
router = APIRouter(
    prefix="/v1/containers", tags=["containers"], dependencies=[Depends(checked_params)]
)


@router.post("", dependencies=[Depends(checked_request)])
async def create_container(
    request: Request,
    body: schemas.CreateContainerBody,
    principal: PrincipalDep,
    services: ServicesDep,
) -> Response:
    req = CreateContainer(
        name=body.name,
        memory_limit=body.memory_limit or "1g",
        expires_after_minutes=body.expires_after.minutes if body.expires_after else None,
        file_ids=body.file_ids or [],
        network_policy=body.network_policy.model_dump(exclude_none=True)
        if body.network_policy
        else {"type": "disabled"},
        skills=body.skills or [],
        snapshot_id=body.snapshot_id,
    )

    rootfs = services.runtime.describe()

    async def create() -> Response:
        record = await services.containers.create(principal, req)
        return JSONResponse(schemas.container(record, rootfs))

    def created_before(cid: str) -> Response | None:
        # A keyed create cut off by a crash: the container it made (if it got that far) is
        # the answer, rather than a second one.
        try:
            return JSONResponse(schemas.container(services.containers.get(principal, cid), rootfs))
        except NotFound:
            return None

    return await idempotent(request, principal, services, create, rerun=True, resume=created_before)


@router.get("")
async def list_containers(
    principal: PrincipalDep,
    services: ServicesDep,
    paging: PagingDep,
    name: Annotated[str | None, Query(description="only containers with this name")] = None,
) -> JSONResponse:
    records, has_more = services.containers.list(
        principal, after=paging.after, limit=paging.limit, order=paging.order, name=name
    )
    return JSONResponse(
        schemas.page([schemas.container(r, services.runtime.describe()) for r in records], has_more)
    )


@router.get("/{container_id}")
async def retrieve_container(
    container_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    return JSONResponse(
        schemas.container(
            services.containers.get(principal, container_id), services.runtime.describe()
        )
    )


@router.delete("/{container_id}")
async def delete_container(
    container_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    await services.containers.delete(principal, container_id)
    return JSONResponse(schemas.deleted(container_id, "container.deleted"))


@router.post("/{container_id}/pause")
async def pause_container(
    container_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    """Freeze the container's processes with their memory; the next call (or ``/resume``)
    thaws them."""
    record = await services.containers.pause(principal, container_id)
    return JSONResponse(schemas.container(record, services.runtime.describe()))


@router.post("/{container_id}/resume")
async def resume_container(
    container_id: str, principal: PrincipalDep, services: ServicesDep
) -> JSONResponse:
    record = await services.containers.resume(principal, container_id)
    return JSONResponse(schemas.container(record, services.runtime.describe()))


@router.post("/{container_id}/snapshots", dependencies=[Depends(checked_request)])
async def create_snapshot(
    request: Request,
    container_id: str,
    principal: PrincipalDep,
    services: ServicesDep,
    body: schemas.CreateSnapshotBody | None = None,
) -> Response:
    """Save the container's writable state (``/mnt/data``, ``/home/user``, its rootfs layer;
    not ``/tmp``); its processes keep running."""
    name = body.name if body is not None else None

    async def create() -> Response:
        record = await services.snapshots.create(principal, container_id, name)
        return JSONResponse(schemas.snapshot(record, services.snapshots.expires_at(record)))

    return await idempotent(request, principal, services, create, rerun=True)


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


CALL_ITEM = "one tool-call item"
CALL_BODY: dict[str, Any] = {  # the body is read by hand (json_body.py): describe it here
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "one tool-call item as a model emits it",
                }
            }
        },
    }
}


def check_item(item: dict[str, Any]) -> None:
    """The item against the model its ``type`` names (a 400 naming the field); an unknown
    type is the calls service's to refuse, which lists the types it runs."""
    model = schemas.CALL_ITEMS.get(str(item.get("type")))
    if model is None:
        return
    try:
        model.model_validate(item)
    except ValidationError as exc:
        errors = exc.errors()
        param = schemas.field_path(model, errors[0]["loc"])
        raise InvalidRequest(invalid_request(errors, param), param=param) from None


@router.post("/{container_id}/calls", openapi_extra=CALL_BODY)
async def create_call(
    request: Request,
    container_id: str,
    principal: PrincipalDep,
    services: ServicesDep,
    stream: Annotated[bool, Query(description="answer with server-sent events")] = False,
) -> Any:
    """Run one ``shell_call``, ``local_shell_call`` or ``apply_patch_call`` item; returns the
    matching output item (or, with ``?stream=true``, SSE events ending with that item)."""
    item = await read_json_object(request, what=CALL_ITEM)
    check_value(item)  # before anything runs: a lone surrogate or NUL is a 400 naming its field
    check_item(item)
    if not stream:

        async def run() -> Response:
            meter = services.metering.direct_call(principal, container_id, str(item.get("type")))
            out = await services.calls.call(principal, container_id, item)
            meter.done(out)  # billed before the answer goes out
            return JSONResponse(out)

        # A retry after a crash must not run the command a second time: rerun=False.
        return await idempotent(request, principal, services, run, rerun=False)
    if item.get("type") != "shell_call":
        msg = "?stream=true is supported for shell_call items only"
        raise InvalidRequest(msg, param="stream")
    services.calls.shell_request(item)  # validate before the 200 goes out
    services.calls.call_id(item)
    services.containers.get(principal, container_id)
    # With an Idempotency-Key, the final output item is kept; a retry gets it back as one
    # response.output_item.done event (without the deltas).
    key = request_key(request)
    claim = None
    if key is not None:
        begun = await begin(request, principal, services, key, rerun=False)
        if begun.replay is not None:
            done = {
                "type": "response.output_item.done",
                "sequence_number": 1,
                "output_index": 0,
                "item": json.loads(begun.replay.body),
            }
            return StreamingResponse(
                iter([_sse(done)]), media_type="text/event-stream", headers=REPLAYED
            )
        claim = begun.claim
    idem = idempotency_service(services)
    # An async generator (typed as an iterator by the service): closed below when the
    # client leaves, which tells the agent to kill the running command.
    events = cast(
        AsyncGenerator[dict[str, Any], None],
        services.calls.shell_call_events(principal, container_id, item),
    )

    meter = services.metering.direct_call(principal, container_id, "shell_call")

    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                if event["type"] == "response.output_item.done":
                    meter.done(event["item"])  # billed before the last event goes out
                    if claim is not None:
                        result = json.dumps(event["item"], ensure_ascii=False).encode()
                        idem.finish(claim, Stored(200, "application/json", result))
                yield _sse(event)
        except ShellboxError as exc:
            yield _sse(
                {"type": "error", "code": str(exc.code), "message": exc.message, "param": exc.param}
            )
        finally:
            await events.aclose()  # a client that left: the agent kills the running command
            if claim is not None:
                idem.release(claim)  # a stream cut short: a retry runs it (no-op when done)

    # The background task releases the key also when the stream never started (the client
    # left before): the generator's finally would not run then.
    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        background=BackgroundTask(idem.release, claim) if claim is not None else None,
    )
