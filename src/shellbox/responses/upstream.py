"""The model behind the loop: which upstream serves a model name, one turn with it, and the
shapes both dialects share.

A *turn* sends the conversation (Responses API items) and gets back the model's new items:
messages, reasoning, and tool calls. The ``chat`` dialect speaks Chat Completions with the
shell offered as a function; the ``responses`` dialect speaks the Responses API with the
shell in ``local`` mode, so OpenAI models emit native ``shell_call`` items. Upstream failures
become ``UpstreamError`` (502) with a message that says what went wrong, never a 500.
"""

from __future__ import annotations

import json
import logging
import time
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


class DialectAdapter(Protocol):
    path: str

    def payload(self, target: UpstreamTarget, req: TurnRequest) -> dict[str, Any]: ...

    def parse(self, body: Any, tools: ToolSet) -> Turn: ...


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

    async def _post(self, target: UpstreamTarget, path: str, content: bytes) -> httpx.Response:
        url = target.base_url + path
        headers = {"content-type": "application/json"}
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        who = _who(target)
        try:
            resp = await self.http.post(
                url, content=content, headers=headers, timeout=target.timeout_s
            )
        except httpx.TimeoutException:
            log.warning("upstream %s timed out after %ss", url, target.timeout_s)
            msg = f"{who} did not answer within {target.timeout_s:g} s"
            raise UpstreamError(msg) from None
        except httpx.HTTPError as exc:
            log.warning("upstream %s unreachable: %s", url, exc)
            msg = f"{who} could not be reached ({type(exc).__name__})"
            raise UpstreamError(msg) from None
        if resp.status_code >= 400:
            detail = _error_detail(resp)
            log.warning("upstream %s answered %s: %s", url, resp.status_code, detail)
            msg = f"{who} answered HTTP {resp.status_code}: {detail}"
            if 400 <= resp.status_code < 500 and resp.status_code not in (408, 409, 429):
                raise UpstreamRejected(msg)
            raise UpstreamError(msg)
        return resp

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
