"""/v1/messages: the Anthropic Messages shape, with the shell as a server tool (see
shellbox.responses.messages for the tool and block shapes).

The key comes as ``x-api-key`` (Anthropic's header) or ``Authorization: Bearer``. Errors
carry Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}``, with the
OpenAI fields (``param``, ``code``) alongside, so either SDK reads them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Security
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials

from shellbox.api import schemas
from shellbox.api.deps import ServicesDep, bearer_auth, peer_host
from shellbox.api.routes.responses import SSE_HEADERS, responses_service
from shellbox.api.strings import check_value, checked_params
from shellbox.errors import ShellboxError
from shellbox.responses import messages
from shellbox.service.models import Principal

router = APIRouter(tags=["messages"], dependencies=[Depends(checked_params)])


def principal_from_either_header(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_auth)],
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    token = credentials.credentials if credentials else x_api_key
    return services.keys.authenticate(token, peer_host(request))


AnthropicPrincipal = Annotated[Principal, Depends(principal_from_either_header)]


def anthropic_error(exc: ShellboxError) -> JSONResponse:
    headers = {}
    if exc.retryable is not None:
        headers["x-should-retry"] = "true" if exc.retryable else "false"
    error = {"type": exc.type, "message": exc.message, "param": exc.param, "code": str(exc.code)}
    return JSONResponse({"type": "error", "error": error}, status_code=exc.status, headers=headers)


@router.post("/v1/messages")
async def create_message(
    principal: AnthropicPrincipal,
    services: ServicesDep,
    body: schemas.MessagesRequestBody,
) -> Any:
    raw = body.model_dump(exclude_unset=True)
    try:
        check_value(raw)  # here, so that its 400 too has Anthropic's envelope
        request, streamed = messages.parse_messages_request(raw)
        run = await responses_service(services).create_run(principal, request, id_prefix="msg_")
        if not streamed:
            await run.result()
            return JSONResponse(messages.message(run, run.id))
    except ShellboxError as exc:
        return anthropic_error(exc)
    events = messages.stream_events(run, run.id)

    async def sse_body() -> AsyncIterator[bytes]:
        try:
            async for name, data in events:
                yield messages.sse(name, data)
        finally:
            await events.aclose()

    return StreamingResponse(sse_body(), media_type="text/event-stream", headers=SSE_HEADERS)
