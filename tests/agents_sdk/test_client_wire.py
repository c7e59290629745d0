"""The client's pure parts: SSE decoding, event typing and error-envelope mapping."""

from __future__ import annotations

import httpx
import pytest

from shellbox.client import (
    APITimeoutError,
    BadRequestError,
    CallDone,
    CommandDone,
    ConflictError,
    InternalServerError,
    InvalidResponseError,
    OutputDelta,
    RateLimitError,
    ServerEvent,
    StreamError,
)
from shellbox.client.errors import status_error, transport_error
from shellbox.client.wire import SSEDecoder, stream_event


def decode(text: str) -> list[dict[str, object]]:
    decoder = SSEDecoder()
    out = [p for line in text.split("\n") if (p := decoder.feed(line)) is not None]
    if (last := decoder.feed("")) is not None:
        out.append(last)
    return out


def test_sse_events_are_decoded_and_typed() -> None:
    body = (
        ": keep-alive\n\n"
        "event: response.shell_call_output_content.delta\n"
        'data: {"type":"response.shell_call_output_content.delta","command_index":1,'
        '"delta":{"stderr":"oops\\n"}}\n\n'
        "event: response.shell_call_output_content.done\n"
        'data: {"type":"response.shell_call_output_content.done","command_index":1,'
        '"output":[{"stdout":"","stderr":"oops\\n","outcome":{"type":"timeout"}}]}\n\n'
        'data: {"type":"response.output_item.added",\n'
        'data: "item":{}}\n\n'
        'data: {"type":"response.output_item.done","item":{"id":"sho_1","call_id":"c",'
        '"status":"completed","max_output_length":10,"output":[],'
        '"files":[{"container_id":"cntr_1","file_id":"cfile_1","filename":"a.txt"}]}}'
    )
    events = [stream_event(p) for p in decode(body)]
    delta, done, added, final = events
    assert delta == OutputDelta(1, "stderr", "oops\n")
    assert isinstance(done, CommandDone) and done.output.timed_out
    assert isinstance(added, ServerEvent) and added.type == "response.output_item.added"
    assert isinstance(final, CallDone)
    assert final.item.max_output_length == 10
    assert [f.filename for f in final.item.files] == ["a.txt"]


def test_error_events_and_junk_raise() -> None:
    with pytest.raises(StreamError) as err:
        stream_event({"type": "error", "code": "container_expired", "message": "gone"})
    assert (err.value.code, err.value.message) == ("container_expired", "gone")
    with pytest.raises(InvalidResponseError):
        decode("data: {not json\n\n")


def response(status: int, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    request = httpx.Request("GET", "http://127.0.0.1/v1/x")
    return httpx.Response(status, content=body, headers=headers, request=request)


def test_status_errors_mirror_the_envelope() -> None:
    envelope = (
        b'{"error":{"message":"bad limit","type":"invalid_request_error",'
        b'"param":"memory_limit","code":"invalid_value"}}'
    )
    err = status_error(response(400, envelope, {"x-request-id": "req_1"}), envelope)
    assert isinstance(err, BadRequestError)
    assert (err.status_code, err.message, err.param, err.code, err.request_id) == (
        400,
        "bad limit",
        "memory_limit",
        "invalid_value",
        "req_1",
    )
    assert str(err) == "Error code: 400 - bad limit"
    assert isinstance(status_error(response(409, b"{}"), b"{}"), ConflictError)
    assert isinstance(status_error(response(429, b""), b""), RateLimitError)
    plain = status_error(response(502, b"Bad Gateway"), b"Bad Gateway")
    assert isinstance(plain, InternalServerError) and plain.message == "Bad Gateway"


def test_transport_timeouts_are_timeouts() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/containers/c/calls")
    err = transport_error(httpx.ReadTimeout("timed out", request=request))
    assert isinstance(err, APITimeoutError) and isinstance(err, TimeoutError)
    assert "POST http://127.0.0.1:1/v1/containers/c/calls" in err.message
