"""The model behind the loop: which upstream serves a model name, one turn with it, and the
shapes both dialects share.

A *turn* sends the conversation (Responses API items) and gets back the model's new items:
messages, reasoning, and tool calls. The ``chat`` dialect speaks Chat Completions with the
shell offered as a function; the ``responses`` dialect speaks the Responses API with the
shell in ``local`` mode, so OpenAI models emit native ``shell_call`` items. Upstream failures
become ``UpstreamError`` (502) with a message that says what went wrong, never a 500.

A turn of a streamed response is asked with ``stream: true`` (``stream_turn``): each dialect's
``StreamReader`` reads the upstream's Server-Sent Events into ``TextDelta`` (text while the
model writes it) and ``ItemDone`` (an item finished ahead of that text), and at the end into
the same ``Turn`` the non-streamed ``turn`` gives. Tool calls are only in that ``Turn``: they
run once their arguments are whole.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from shellbox.errors import InvalidRequest, UpstreamError
from shellbox.responses.tools import ToolChoice, ToolSet
from shellbox.settings import UpstreamSettings

log = logging.getLogger("shellbox.responses")

Dialect = Literal["chat", "responses"]
DIALECTS = ("chat", "responses")
MODEL_KEYS = ("base_url", "api_key", "dialect", "model", "timeout_s")
ERROR_EXCERPT = 500  # characters of an upstream error body shown to the client


class UpstreamRejected(UpstreamError):
    """The upstream refused the request (a 4xx): sending it again will not help."""

    retryable = False


class UpstreamFailedMidRun(UpstreamError):
    """The upstream failed after tool calls had run: a retry would run them again."""

    retryable = False


@dataclass(frozen=True)
class UpstreamTarget:
    name: str  # the model name the client asked for
    base_url: str
    api_key: str | None
    dialect: Dialect
    model: str  # the model name the upstream knows
    timeout_s: float


def check_models(settings: UpstreamSettings) -> None:
    """Refuse a malformed ``upstream.models`` table at start-up, naming the key."""
    for name, entry in settings.models.items():
        where = f"upstream.models.{name}"
        if not isinstance(entry, dict):
            msg = f"{where} must be a table of {', '.join(MODEL_KEYS)}"
            raise InvalidRequest(msg, param=where)
        unknown = sorted(set(entry) - set(MODEL_KEYS))
        if unknown:
            msg = f"{where} has unknown keys {unknown}; it takes {', '.join(MODEL_KEYS)}"
            raise InvalidRequest(msg, param=where)
        if entry.get("dialect", settings.dialect) not in DIALECTS:
            msg = f"{where}.dialect must be 'chat' or 'responses'"
            raise InvalidRequest(msg, param=where)
        if not (entry.get("base_url") or settings.base_url):
            msg = f"{where} has no base_url, and there is no upstream.base_url to fall back on"
            raise InvalidRequest(msg, param=where)


def resolve_target(settings: UpstreamSettings, model: str) -> UpstreamTarget:
    """A model listed in ``upstream.models`` uses its entry (missing keys fall back to the
    section's defaults); any other name goes to the default upstream as it is."""
    entry = settings.models.get(model, {})
    base_url = entry.get("base_url") or settings.base_url
    if not base_url:
        msg = (
            f"model {model!r} is not available: this server has no upstream for it (start it "
            "with --upstream-base-url, or list the model under upstream.models)"
        )
        raise InvalidRequest(msg, param="model")
    key = entry.get("api_key")
    if key is None and settings.api_key is not None:
        key = settings.api_key.get_secret_value()
    return UpstreamTarget(
        name=model,
        base_url=str(base_url).rstrip("/"),
        api_key=str(key) if key else None,
        dialect=entry.get("dialect", settings.dialect),
        model=str(entry.get("model") or model),
        timeout_s=float(entry.get("timeout_s") or settings.timeout_s),
    )


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def to_wire(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def count(value: Any) -> int:
    """A token count from an upstream's usage block (absent or malformed counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class TurnRequest:
    instructions: str | None
    items: list[dict[str, Any]]
    tools: ToolSet
    tool_choice: ToolChoice
    params: dict[str, Any]  # sampling parameters, by their Responses API names


@dataclass
class Turn:
    items: list[dict[str, Any]]  # in the model's order; calls are complete items
    usage: Usage = field(default_factory=Usage)
    # index in items -> why that call cannot run (bad arguments, an unknown tool): the loop
    # answers it with an error output the model can read, instead of running it.
    errors: dict[int, str] = field(default_factory=dict)
    incomplete_reason: str | None = None  # the model stopped early (max_output_tokens...)
    elapsed_ns: int = 0  # time spent waiting for the upstream


@dataclass(frozen=True)
class TextDelta:
    """Text the model is writing, before its turn ends: ``delta`` extends the text of content
    part ``content_index`` of message ``item_id`` (the turn's item with that id, at the end)."""

    item_id: str
    content_index: int
    delta: str


@dataclass(frozen=True)
class ItemDone:
    """An item the model finished before its turn ended (a reasoning item ahead of the text),
    shown at once so that the text after it streams in the order of the turn's items."""

    item: dict[str, Any]


Live = TextDelta | ItemDone
TurnPart = TextDelta | ItemDone | Turn  # what stream_turn yields: the Turn comes last


class StreamReader(Protocol):
    """Reads one streamed answer, event by event (``event`` is the SSE event name, ``""``
    when there is none)."""

    @property
    def complete(self) -> bool:
        """The final event arrived: ``finish`` will give the turn."""
        ...

    def feed(self, event: str, data: str) -> list[Live]: ...

    def finish(self) -> Turn:
        """The whole turn; an answer that ended before its final event is an UpstreamError."""
        ...


class DialectAdapter(Protocol):
    path: str

    def payload(self, target: UpstreamTarget, req: TurnRequest) -> dict[str, Any]: ...

    def parse(self, body: Any, tools: ToolSet) -> Turn: ...

    def stream_fields(self) -> dict[str, Any]:
        """What a streamed request adds to the payload."""
        ...

    def reader(self, tools: ToolSet) -> StreamReader: ...


class SseDecoder:
    """Server-Sent Events from lines (the ``event`` and ``data`` fields; ``id``, ``retry``
    and comments mean nothing here)."""

    def __init__(self) -> None:
        self.event = ""
        self.data: list[str] = []

    def line(self, line: str) -> tuple[str, str] | None:
        """Takes one line; returns ``(event, data)`` when it ends an event."""
        if not line:
            return self.flush()
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        return None

    def flush(self) -> tuple[str, str] | None:
        """The event in progress, if any (also at the end of the stream: some servers do not
        end their last event with a blank line)."""
        event, data = self.event, self.data
        self.event, self.data = "", []
        return (event, "\n".join(data)) if data else None


class UpstreamClient:
    """One pooled HTTP client for every upstream (keep-alive matters: a turn is one request)."""

    def __init__(self, dialects: dict[str, DialectAdapter]) -> None:
        self.dialects = dialects
        self.http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
            follow_redirects=False,
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def turn(self, target: UpstreamTarget, req: TurnRequest) -> Turn:
        dialect = self.dialects[target.dialect]
        content = json.dumps(dialect.payload(target, req), ensure_ascii=False).encode()
        # Only the exchange itself is timed: encoding and decoding are shellbox's work.
        started = time.perf_counter_ns()
        resp = await self._post(target, dialect.path, content)
        elapsed = time.perf_counter_ns() - started
        turn = dialect.parse(self._decode(target, resp), req.tools)
        turn.elapsed_ns = elapsed
        return turn

    async def stream_turn(
        self, target: UpstreamTarget, req: TurnRequest
    ) -> AsyncGenerator[TurnPart, None]:
        """One turn asked with streaming: text as the model writes it, then the whole turn.
        An upstream that ignores ``stream`` and answers JSON is read as ``turn`` reads it."""
        dialect = self.dialects[target.dialect]
        body = {**dialect.payload(target, req), **dialect.stream_fields()}
        content = json.dumps(body, ensure_ascii=False).encode()
        started = time.perf_counter_ns()
        resp = await self._open(target, dialect.path, content)
        try:
            if not resp.headers.get("content-type", "").lower().startswith("text/event-stream"):
                await self._read(target, resp)
                turn = dialect.parse(self._decode(target, resp), req.tools)
                turn.elapsed_ns = time.perf_counter_ns() - started
                yield turn
                return
            reader = dialect.reader(req.tools)
            # Only waiting for the upstream is timed, not the client reading what we yield.
            waited, since = 0, started
            async with aclosing(self._events(target, resp, reader)) as events:
                async for event, data in events:
                    waited += time.perf_counter_ns() - since
                    for part in reader.feed(event, data):
                        yield part
                    since = time.perf_counter_ns()
            waited += time.perf_counter_ns() - since
            turn = reader.finish()
            turn.elapsed_ns = waited
            yield turn
        finally:
            await resp.aclose()  # a client that left mid-turn: the upstream stops too

    async def _events(
        self, target: UpstreamTarget, resp: httpx.Response, reader: StreamReader
    ) -> AsyncGenerator[tuple[str, str], None]:
        """The SSE events of a streamed answer. A connection that breaks or goes quiet before
        the final event is an UpstreamError; after it, the answer is whole and that is fine."""
        decoder = SseDecoder()
        who = _who(target)
        try:
            async for line in resp.aiter_lines():
                event = decoder.line(line)
                if event is not None:
                    yield event
            event = decoder.flush()
            if event is not None:
                yield event
        except httpx.TimeoutException:
            if reader.complete:
                return
            log.warning("upstream %s went quiet for %ss mid-answer", resp.url, target.timeout_s)
            msg = f"{who} stopped sending its answer for {target.timeout_s:g} s"
            raise UpstreamError(msg) from None
        except httpx.HTTPError as exc:
            if reader.complete:
                return
            log.warning("upstream %s broke off its answer: %s", resp.url, exc)
            msg = f"{who} broke off its streamed answer ({type(exc).__name__}: {exc})"
            raise UpstreamError(msg) from None

    async def _post(self, target: UpstreamTarget, path: str, content: bytes) -> httpx.Response:
        url = target.base_url + path
        try:
            resp = await self.http.post(
                url, content=content, headers=_headers(target), timeout=target.timeout_s
            )
        except httpx.HTTPError as exc:
            raise _unreachable(target, url, exc) from None
        if resp.status_code >= 400:
            raise _refused(target, url, resp)
        return resp

    async def _open(self, target: UpstreamTarget, path: str, content: bytes) -> httpx.Response:
        """``_post`` for a streamed answer: returns once the headers are in (an error status
        is read whole, for its message)."""
        url = target.base_url + path
        request = self.http.build_request(
            "POST", url, content=content, headers=_headers(target), timeout=target.timeout_s
        )
        try:
            resp = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _unreachable(target, url, exc) from None
        if resp.status_code >= 400:
            try:
                await self._read(target, resp)
            finally:
                await resp.aclose()
            raise _refused(target, url, resp)
        return resp

    @staticmethod
    async def _read(target: UpstreamTarget, resp: httpx.Response) -> None:
        """The rest of a streamed body (an answer that was not a stream after all)."""
        try:
            await resp.aread()
        except httpx.HTTPError as exc:
            raise _unreachable(target, str(resp.url), exc) from None

    @staticmethod
    def _decode(target: UpstreamTarget, resp: httpx.Response) -> Any:
        try:
            return json.loads(resp.content)
        except ValueError:
            excerpt = resp.text[:ERROR_EXCERPT]
            msg = f"{_who(target)} answered with a body that is not JSON: {excerpt!r}"
            raise UpstreamError(msg) from None


def _who(target: UpstreamTarget) -> str:
    return f"the upstream for model {target.name!r}"


def _headers(target: UpstreamTarget) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    return headers


def _unreachable(target: UpstreamTarget, url: str, exc: httpx.HTTPError) -> UpstreamError:
    who = _who(target)
    if isinstance(exc, httpx.TimeoutException):
        log.warning("upstream %s timed out after %ss", url, target.timeout_s)
        msg = f"{who} did not answer within {target.timeout_s:g} s"
        return UpstreamError(msg)
    log.warning("upstream %s unreachable: %s", url, exc)
    msg = f"{who} could not be reached ({type(exc).__name__})"
    return UpstreamError(msg)


def _refused(target: UpstreamTarget, url: str, resp: httpx.Response) -> UpstreamError:
    detail = _error_detail(resp)
    log.warning("upstream %s answered %s: %s", url, resp.status_code, detail)
    msg = f"{_who(target)} answered HTTP {resp.status_code}: {detail}"
    if 400 <= resp.status_code < 500 and resp.status_code not in (408, 409, 429):
        return UpstreamRejected(msg)
    return UpstreamError(msg)


def _error_detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:ERROR_EXCERPT] or resp.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:ERROR_EXCERPT]
    if isinstance(error, str):
        return error[:ERROR_EXCERPT]
    return resp.text[:ERROR_EXCERPT]


def malformed(target_what: str) -> UpstreamError:
    msg = f"the upstream's answer is malformed: {target_what}"
    return UpstreamError(msg)


def streamed_chunk(data: str) -> dict[str, Any]:
    """One event's data, as a JSON object."""
    try:
        chunk = json.loads(data)
    except ValueError:
        msg = f"a streamed event is not JSON: {data[:ERROR_EXCERPT]!r}"
        raise malformed(msg) from None
    if not isinstance(chunk, dict):
        msg = f"a streamed event is not a JSON object: {data[:ERROR_EXCERPT]!r}"
        raise malformed(msg)
    return chunk


def reported_error(error: Any) -> UpstreamError:
    """An error the upstream sent in the middle of a streamed answer."""
    why = error.get("message") if isinstance(error, dict) else error
    why = str(why)[:ERROR_EXCERPT] if why else "no reason given"
    msg = f"the upstream reported an error in the middle of its answer: {why}"
    return UpstreamError(msg)


def cut_short(final: str) -> UpstreamError:
    msg = f"the upstream's streamed answer was cut short: it ended before {final}"
    return UpstreamError(msg)
