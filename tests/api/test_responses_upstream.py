"""The scripted upstream model, and how shellbox copes with upstreams that fail.

``ScriptedLLM`` is a real HTTP server on a loopback port that plays the model in both
dialects (``POST /v1/chat/completions`` and ``POST /v1/responses``): each request it gets is
handed to the next step of the current script, which checks what shellbox sent (tools, fed
back outputs) and answers with tool calls or text. A failed check answers HTTP 500 with the
assertion's text, so it surfaces in the test's own failure, and is kept for ``done()``.

A request with ``stream: true`` is answered the way each API streams (chat completion chunks
ending with ``[DONE]``, or Responses events ending with ``response.completed``), written and
flushed one event at a time, with the text and the arguments in ``Reply.pieces`` pieces. A
reply can make the stream wait for a ``threading.Event`` before its last event (``hold``),
stop early (``cut_after``, cleanly or with the connection dropped), or be plain JSON anyway
(``stream=False``, as servers that ignore ``stream`` answer).

The other response/message test modules import the helpers from here (tests/ is not a
package; tests/api is on the path, as for ``api_helpers``).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODELS = {"chat": "scripted-chat", "responses": "scripted-responses"}
UPSTREAM_KEY = "sk-upstream-responses-dialect"
DEFAULT_KEY = "sk-upstream-default"
MAX_ITERATIONS = 4  # the test server's per-response caps
MAX_SANDBOX_S = 4
MAX_TOOL_OUTPUT = 150_000
HOLD_S = 30  # how long a held stream waits for its test before it gives up (and fails it)


# -- what the upstream saw ----------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def dialect(self) -> str:
        return "chat" if self.path.endswith("/chat/completions") else "responses"

    def tool_names(self) -> list[str]:
        out = []
        for t in self.body.get("tools", []):
            if self.dialect == "chat":
                out.append(t["function"]["name"])
            else:
                out.append(t.get("name") or t["type"])
        return out

    def tool(self, name: str) -> dict[str, Any]:
        for t in self.body.get("tools", []):
            if self.dialect == "chat" and t["function"]["name"] == name:
                return dict(t["function"])
            if self.dialect == "responses" and (t.get("name") or t["type"]) == name:
                return dict(t)
        raise AssertionError(f"no tool {name!r} in {self.tool_names()}")

    def system(self) -> str:
        if self.dialect == "chat":
            return "\n".join(m["content"] for m in self.body["messages"] if m["role"] == "system")
        return str(self.body.get("instructions") or "")

    def outputs(self) -> list[dict[str, Any]]:
        """Tool outputs fed back, in order: {call_id, result} (a shell call's result is its
        list of per-command entries; others their text)."""
        out = []
        if self.dialect == "chat":
            for m in self.body["messages"]:
                if m["role"] == "tool":
                    try:
                        parsed = json.loads(m["content"])
                    except ValueError:
                        parsed = m["content"]
                    if isinstance(parsed, dict) and "output" in parsed and len(parsed) == 1:
                        parsed = parsed["output"]
                    out.append({"call_id": m["tool_call_id"], "result": parsed})
        else:
            for item in self.body["input"]:
                if str(item.get("type", "")).endswith("_output"):
                    result = item["output"]
                    if item["type"] == "apply_patch_call_output":
                        result = {"status": item["status"], "output": item.get("output")}
                    out.append({"call_id": item["call_id"], "result": result})
        return out

    def last_result(self) -> Any:
        outputs = self.outputs()
        assert outputs, "no tool output was fed back"
        return outputs[-1]["result"]

    def user_texts(self) -> list[str]:
        texts = []
        items = self.body["messages"] if self.dialect == "chat" else self.body["input"]
        for m in items:
            if m.get("role") == "user":
                content = m["content"]
                if isinstance(content, str):
                    texts.append(content)
                else:
                    texts.append("".join(p.get("text", "") for p in content))
        return texts


# -- what it answers ------------------------------------------------------------------------------


@dataclass
class Call:
    name: str
    arguments: Any  # a dict, or a raw string (to send broken JSON)
    call_id: str | None = None


@dataclass
class Reply:
    text: str | None = None
    calls: list[Call] = field(default_factory=list)
    usage: tuple[int, int] = (100, 10)
    status: int = 200
    raw: Any = None  # sent as is (bytes or JSON) instead of a rendered answer
    delay_s: float = 0.0
    finish: str | None = None
    reasoning: str | None = None  # responses dialect: a reasoning item ahead of the rest
    # -- when the request asks for a stream --
    stream: bool = True  # False: answer JSON all the same
    pieces: int = 3  # the text, and each call's arguments, come in this many pieces
    pause_s: float = 0.005  # between two events
    hold: threading.Event | None = None  # waited for before the last event
    cut_after: int | None = None  # send only this many events
    drop: bool = False  # with cut_after: drop the connection (the body never ends)
    events: list[Any] | None = None  # sent as the stream instead of a rendered one
    finished: threading.Event = field(default_factory=threading.Event)  # last event sent


def shell(
    *commands: str, call_id: str | None = None, usage: tuple[int, int] = (100, 10), **action: Any
) -> Reply:
    return Reply(
        calls=[Call("shell", {"commands": list(commands), **action}, call_id)], usage=usage
    )


def say(text: str, usage: tuple[int, int] = (100, 10)) -> Reply:
    return Reply(text=text, usage=usage)


def call(name: str, arguments: Any, call_id: str | None = None) -> Reply:
    return Reply(calls=[Call(name, arguments, call_id)])


Step = Callable[[Seen], Reply] | Reply

_counter = iter(range(1, 1_000_000))


def render(seen: Seen, reply: Reply) -> Any:
    n = next(_counter)
    prompt, completion = reply.usage
    if seen.dialect == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.calls:
            message["tool_calls"] = [
                {
                    "id": c.call_id or f"call_up{n}_{i}",
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": c.arguments
                        if isinstance(c.arguments, str)
                        else json.dumps(c.arguments),
                    },
                }
                for i, c in enumerate(reply.calls)
            ]
        finish = reply.finish or ("tool_calls" if reply.calls else "stop")
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": seen.body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    output: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_up{n}",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
            }
        )
    if reply.text is not None:
        output.append(
            {
                "type": "message",
                "id": f"msg_up{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for i, c in enumerate(reply.calls):
        call_id = c.call_id or f"call_up{n}_{i}"
        args = c.arguments if isinstance(c.arguments, dict) else {"raw": c.arguments}
        if c.name == "shell":
            output.append(
                {
                    "type": "shell_call",
                    "id": f"sh_up{n}_{i}",
                    "call_id": call_id,
                    "action": {
                        "commands": args.get("commands"),
                        "timeout_ms": args.get("timeout_ms"),
                        "max_output_length": args.get("max_output_length"),
                    },
                    "status": "completed",
                    "environment": {"type": "local"},
                }
            )
        elif c.name == "apply_patch":
            output.append(
                {
                    "type": "apply_patch_call",
                    "id": f"apc_up{n}_{i}",
                    "call_id": call_id,
                    "status": "completed",
                    "operation": {
                        "type": args["operation"],
                        "path": args["path"],
                        "diff": args.get("diff"),
                    },
                }
            )
        else:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_up{n}_{i}",
                    "call_id": call_id,
                    "name": c.name,
                    "arguments": c.arguments
                    if isinstance(c.arguments, str)
                    else json.dumps(c.arguments),
                    "status": "completed",
                }
            )
    return {
        "id": f"resp_up{n}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if reply.finish == "length" else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if reply.finish == "length" else None,
        "model": seen.body["model"],
        "output": output,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


def split(text: str, pieces: int) -> list[str]:
    """``text`` in ``pieces`` pieces (fewer when it is shorter), none empty."""
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def chat_chunks(seen: Seen, reply: Reply) -> list[Any]:
    """The completion ``render`` gives, as the chunks of a streamed one."""
    body = render(seen, reply)
    [choice] = body["choices"]
    message = choice["message"]
    head = {k: body[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks: list[Any] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in split(message["content"] or "", reply.pieces)]
    for i, tc in enumerate(message.get("tool_calls", [])):
        first = {"name": tc["function"]["name"], "arguments": ""}
        opening = {"index": i, "id": tc["id"], "type": "function", "function": first}
        chunks.append(chunk({"tool_calls": [opening]}))
        for piece in split(tc["function"]["arguments"], reply.pieces):
            chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if (seen.body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    chunks.append("[DONE]")
    return chunks


def responses_events(seen: Seen, reply: Reply) -> list[Any]:
    """The response ``render`` gives, as the events of a streamed one."""
    body = render(seen, reply)
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(numbers), **fields}

    start = {**body, "status": "in_progress", "output": [], "usage": None}
    events = [
        event("response.created", response=start),
        event("response.in_progress", response=start),
    ]
    for k, item in enumerate(body["output"]):
        added = {**item, "status": "in_progress"}
        if item["type"] == "message":
            added["content"] = []
        if item["type"] == "function_call":
            added["arguments"] = ""
        events.append(event("response.output_item.added", output_index=k, item=added))
        ids = {"item_id": item["id"], "output_index": k}
        for c, part in enumerate(item["content"] if item["type"] == "message" else []):
            events.append(
                event(
                    "response.content_part.added", **ids, content_index=c, part={**part, "text": ""}
                )
            )
            for piece in split(part["text"], reply.pieces):
                events.append(
                    event(
                        "response.output_text.delta",
                        **ids,
                        content_index=c,
                        delta=piece,
                        logprobs=[],
                    )
                )
            events.append(
                event("response.output_text.done", **ids, content_index=c, text=part["text"])
            )
            events.append(event("response.content_part.done", **ids, content_index=c, part=part))
        if item["type"] == "function_call":
            for piece in split(item["arguments"], reply.pieces):
                events.append(event("response.function_call_arguments.delta", **ids, delta=piece))
            events.append(
                event("response.function_call_arguments.done", **ids, arguments=item["arguments"])
            )
        events.append(event("response.output_item.done", output_index=k, item=item))
    final = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    events.append(event(final, response=body))
    return events


def sse_block(event: Any) -> bytes:
    """One SSE event: a string is sent as its data line, an event with a type names it."""
    if isinstance(event, bytes):
        return event
    if isinstance(event, str):
        return f"data: {event}\n\n".encode()
    data = json.dumps(event)
    if str(event.get("type", "")).startswith(("response.", "error")):
        return f"event: {event['type']}\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()


@dataclass
class Answer:
    status: int
    body: Any = None  # JSON, or bytes
    events: list[Any] | None = None  # the events of a streamed answer
    reply: Reply = field(default_factory=Reply)


class ScriptedLLM:
    def __init__(self) -> None:
        self.steps: deque[Step] = deque()
        self.seen: list[Seen] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                seen = Seen(self.path, body, {k.lower(): v for k, v in self.headers.items()})
                answer = llm.answer(seen)
                if answer.reply.delay_s:
                    time.sleep(answer.reply.delay_s)
                try:
                    if answer.events is not None:
                        self.stream(answer.status, answer.events, answer.reply)
                        return
                    payload = answer.body
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(answer.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # shellbox gave up on this answer

            def stream(self, status: int, events: list[Any], reply: Reply) -> None:
                """The events as a chunked body, one write and one pause per event."""
                self.send_response(status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for n, event in enumerate(events):
                    if reply.cut_after is not None and n >= reply.cut_after:
                        break
                    last = n == len(events) - 1
                    if last and reply.hold is not None and not reply.hold.wait(HOLD_S):
                        llm.failures.append(f"the held stream waited {HOLD_S} s in vain")
                    data = sse_block(event)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    time.sleep(reply.pause_s)
                else:
                    reply.finished.set()
                if reply.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: no last chunk
                    return
                self.wfile.write(b"0\r\n\r\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def script(self, *steps: Step) -> None:
        with self.lock:
            self.steps = deque(steps)
            self.seen = []
            self.failures = []

    def answer(self, seen: Seen) -> Answer:
        with self.lock:
            self.seen.append(seen)
            step = self.steps.popleft() if self.steps else None
        if step is None:
            self.failures.append(f"unexpected request {len(self.seen)}: the script is over")
            return Answer(500, {"error": {"message": "the script is over"}})
        try:
            reply = step(seen) if callable(step) else step
        except AssertionError as exc:
            self.failures.append(f"step {len(self.seen)}: {exc}")
            return Answer(500, {"error": {"message": f"scripted check failed: {exc}"}})
        if reply.events is not None:
            return Answer(reply.status, events=reply.events, reply=reply)
        if reply.raw is not None:
            return Answer(reply.status, reply.raw, reply=reply)
        if seen.body.get("stream") and reply.stream:
            render_events = chat_chunks if seen.dialect == "chat" else responses_events
            return Answer(reply.status, events=render_events(seen, reply), reply=reply)
        return Answer(reply.status, render(seen, reply), reply=reply)

    def done(self) -> list[Seen]:
        """Every step ran, and every check passed; returns what the upstream saw."""
        assert not self.failures, self.failures
        assert not self.steps, f"{len(self.steps)} scripted steps were not used"
        return self.seen


# -- the shared scripted upstream and the shellbox server that uses it ---------------------------


@dataclass
class LLMEnv:
    llm: ScriptedLLM
    server: Any  # conftest.ServerProcess
    api_key: str
    client: openai.OpenAI

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.root_url,
            timeout=60,
            headers={"authorization": f"Bearer {self.api_key}"},
        )


_env: LLMEnv | None = None


def llm_env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    """One scripted upstream and one shellbox server for every response/message test module.
    The server maps two model names to the upstream in each dialect through its config file,
    and sends any other name to the default upstream given by the CLI flags."""
    global _env
    if _env is not None:
        yield _env
        return
    llm = ScriptedLLM()
    server = server_factory(start=False)
    config = Path(server.state_dir) / "shellbox.toml"
    config.write_text(
        f"""
[upstream]
max_iterations = {MAX_ITERATIONS}
max_sandbox_s = {MAX_SANDBOX_S}
max_tool_output_chars = {MAX_TOOL_OUTPUT}

[upstream.models.{MODELS["chat"]}]
base_url = "{llm.base_url}"
dialect = "chat"
model = "stub-chat-model"

[upstream.models.{MODELS["responses"]}]
base_url = "{llm.base_url}"
dialect = "responses"
model = "stub-responses-model"
api_key = "{UPSTREAM_KEY}"

[upstream.models.scripted-slow]
dialect = "chat"
timeout_s = 0.5
"""
    )
    server.args += [
        "--config",
        str(config),
        "--upstream-base-url",
        llm.base_url,
        "--upstream-api-key",
        DEFAULT_KEY,
        "--upstream-dialect",
        "chat",
    ]
    key = server.create_key("responses")
    server.start()
    _env = LLMEnv(
        llm, server, key, openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    )
    try:
        yield _env
    finally:
        _env.client.close()
        llm.close()
        _env = None


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


SHELL_AUTO = [{"type": "shell", "environment": {"type": "container_auto"}}]


# -- upstream failures ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["chat", "responses"])
def test_upstream_5xx_is_a_502_with_its_message(env: LLMEnv, dialect: str) -> None:
    env.llm.script(Reply(status=503, raw={"error": {"message": "model is overloaded"}}))
    with pytest.raises(openai.APIStatusError) as info:
        env.client.responses.create(model=MODELS[dialect], input="hi", tools=SHELL_AUTO)
    assert info.value.status_code == 502
    assert "HTTP 503" in info.value.message
    assert "model is overloaded" in info.value.message
    env.llm.done()


def test_upstream_4xx_is_a_502_not_retried(env: LLMEnv) -> None:
    env.llm.script(Reply(status=400, raw={"error": {"message": "unknown parameter"}}))
    with env.http() as http:
        r = http.post("/v1/responses", json={"model": MODELS["chat"], "input": "hi"})
    assert r.status_code == 502
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["code"] == "upstream_error"
    assert "unknown parameter" in r.json()["error"]["message"]
    env.llm.done()


def test_upstream_failure_after_calls_ran_is_not_retried(env: LLMEnv) -> None:
    env.llm.script(shell("echo ran"), Reply(status=503, raw={"error": {"message": "gone"}}))
    with env.http() as http:
        r = http.post(
            "/v1/responses", json={"model": MODELS["chat"], "input": "x", "tools": SHELL_AUTO}
        )
    assert r.status_code == 502
    assert r.headers["x-should-retry"] == "false"
    assert "1 tool call(s) had run" in r.json()["error"]["message"]
    env.llm.done()


def test_upstream_body_not_json(env: LLMEnv) -> None:
    env.llm.script(Reply(raw=b"<html>bad gateway</html>"))
    with pytest.raises(openai.APIStatusError) as info:
        env.client.responses.create(model=MODELS["chat"], input="hi")
    assert info.value.status_code == 502
    assert "not JSON" in info.value.message
    env.llm.done()


def test_upstream_malformed_answer(env: LLMEnv) -> None:
    env.llm.script(Reply(raw={"choices": []}))
    with pytest.raises(openai.APIStatusError) as info:
        env.client.responses.create(model=MODELS["chat"], input="hi")
    assert info.value.status_code == 502
    assert "no choices" in info.value.message
    env.llm.done()


def test_upstream_timeout(env: LLMEnv) -> None:
    env.llm.script(Reply(text="too late", delay_s=2.0))
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        env.client.responses.create(model="scripted-slow", input="hi")
    assert info.value.status_code == 502
    assert "did not answer within 0.5 s" in info.value.message
    assert time.monotonic() - started < 1.8
    env.llm.done()


def test_upstream_failure_mid_stream_ends_with_response_failed(env: LLMEnv) -> None:
    env.llm.script(shell("echo one"), Reply(status=500, raw={"error": {"message": "boom"}}))
    stream = env.client.responses.create(
        model=MODELS["chat"], input="hi", tools=SHELL_AUTO, stream=True
    )
    events = list(stream)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error is not None and "boom" in failed.error.message
    # The shell call ran before the upstream failed, and the stored response keeps it.
    kinds = [i.type for i in failed.output]
    assert kinds == ["shell_call", "shell_call_output"]
    assert env.client.responses.retrieve(failed.id).status == "failed"
    env.llm.done()


# A chunk of text, in each dialect's streamed form.
TEXT_CHUNK = {
    "chat": {"choices": [{"index": 0, "delta": {"content": "Partial"}, "finish_reason": None}]},
    "responses": {
        "type": "response.output_text.delta",
        "item_id": "msg_up",
        "output_index": 0,
        "content_index": 0,
        "delta": "Partial",
    },
}


def completed(output: list[dict[str, Any]]) -> dict[str, Any]:
    response = {"status": "completed", "output": output, "usage": None}
    return {"type": "response.completed", "response": response}


def test_a_streamed_message_keeps_the_id_it_was_shown_with(env: LLMEnv) -> None:
    """A proxy may give the final response's items ids other than its events had."""
    message = {"type": "message", "id": "msg_renumbered", "role": "assistant"}
    message |= {"status": "completed", "content": [{"type": "output_text", "text": "Partial"}]}
    env.llm.script(Reply(events=[TEXT_CHUNK["responses"], completed([message])]))
    with env.client.responses.stream(model=MODELS["responses"], input="hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    env.llm.done()
    [added] = [e for e in events if e.type == "response.output_item.added"]
    assert added.item.id == final.output[0].id == "msg_up"
    assert final.output_text == "Partial"


def test_a_chat_stream_that_ends_after_its_finish_reason_is_whole(env: LLMEnv) -> None:
    """Some servers close the stream after the chunk with the finish_reason (and the usage)
    without a [DONE] line: the answer is whole."""
    # role, four pieces of text, the finish_reason, the usage; no [DONE]
    env.llm.script(Reply(text="one two six ten!", pieces=4, cut_after=7))
    with env.client.responses.stream(model=MODELS["chat"], input="hi") as stream:
        final = stream.get_final_response()
    env.llm.done()
    assert final.status == "completed" and final.output_text == "one two six ten!"
    assert final.usage is not None and final.usage.total_tokens > 0


def failed_stream(env: LLMEnv, model: str, **extra: Any) -> tuple[list[str], Any]:
    """Runs a streamed response that must fail: its text deltas, and the failed response
    (also as it was stored)."""
    events = list(env.client.responses.create(model=model, input="hi", stream=True, **extra))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed", [e.type for e in events]
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error is not None
    assert env.client.responses.retrieve(failed.id).status == "failed"
    env.llm.done()
    return [e.delta for e in events if e.type == "response.output_text.delta"], failed


@pytest.mark.parametrize("dialect", ["chat", "responses"])
@pytest.mark.parametrize("drop", [False, True], ids=["ended", "dropped"])
def test_a_stream_cut_short_ends_with_response_failed(
    env: LLMEnv, dialect: str, drop: bool
) -> None:
    """The body ends (or the connection drops) after two pieces of text, before the final
    chunk: the text shown so far stays, in a message marked incomplete."""
    before_text = 1 if dialect == "chat" else 4  # events ahead of the first piece of text
    reply = Reply(text="one two six ten!", pieces=4, cut_after=before_text + 2, drop=drop)
    env.llm.script(reply)
    deltas, failed = failed_stream(env, MODELS[dialect])
    assert deltas == ["one ", "two "]
    final = (
        "its finish_reason and [DONE] line"
        if dialect == "chat"
        else "its final event (response.completed)"
    )
    expected = (
        "broke off its streamed answer" if drop else f"was cut short: it ended before {final}"
    )
    assert expected in failed.error.message
    [message] = failed.output
    assert message.type == "message" and message.status == "incomplete"
    assert message.content[0].text == "one two "


@pytest.mark.parametrize(
    ("dialect", "events", "expected"),
    [
        (
            "chat",
            [TEXT_CHUNK["chat"], {"error": {"message": "overloaded mid-answer"}}],
            "reported an error in the middle of its answer: overloaded mid-answer",
        ),
        ("chat", [TEXT_CHUNK["chat"], "{not json"], "a streamed event is not JSON: '{not json'"),
        ("chat", [{"choices": {"index": 0}}], "a streamed chunk's choices is not a list"),
        (
            "responses",
            [TEXT_CHUNK["responses"], {"type": "error", "message": "overloaded mid-answer"}],
            "reported an error in the middle of its answer: overloaded mid-answer",
        ),
        (
            "responses",
            [
                {
                    "type": "response.failed",
                    "response": {
                        "status": "failed",
                        "error": {"code": "server_error", "message": "the model crashed"},
                        "output": [],
                    },
                }
            ],
            "the response failed: the model crashed",
        ),
        ("responses", ["[1, 2]"], "a streamed event is not a JSON object"),
        (
            "responses",
            [TEXT_CHUNK["responses"], completed([{"type": "function_call", "call_id": "c1"}])],
            "streamed a message as output item 0 of the turn, where the final response has "
            "function_call",
        ),
    ],
    ids=[
        "chat-error",
        "chat-not-json",
        "chat-bad-choices",
        "error",
        "failed",
        "not-an-object",
        "mismatch",
    ],
)
def test_a_stream_that_goes_wrong_ends_with_response_failed(
    env: LLMEnv, dialect: str, events: list[Any], expected: str
) -> None:
    env.llm.script(Reply(events=events))
    _, failed = failed_stream(env, MODELS[dialect])
    assert expected in failed.error.message


def test_an_error_status_on_a_streamed_turn_ends_with_response_failed(env: LLMEnv) -> None:
    env.llm.script(Reply(status=400, raw={"error": {"message": "stream_options is unknown"}}))
    deltas, failed = failed_stream(env, MODELS["chat"])
    assert deltas == []
    assert "answered HTTP 400: stream_options is unknown" in failed.error.message


def test_a_stream_that_goes_quiet_times_out(env: LLMEnv) -> None:
    """scripted-slow's timeout is 0.5 s: the stream stops for 10 s after its first chunk."""
    env.llm.script(Reply(text="slow words", pause_s=10.0))
    started = time.monotonic()
    _, failed = failed_stream(env, "scripted-slow")
    assert "stopped sending its answer for 0.5 s" in failed.error.message
    assert time.monotonic() - started < 8


@pytest.mark.parametrize("dialect", ["chat", "responses"])
def test_broken_tool_arguments_go_back_to_the_model(env: LLMEnv, dialect: str) -> None:
    broken = '{"commands": ["ls"' if dialect == "chat" else {"commands": "ls", "timeout_ms": "x"}

    def check(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["outcome"] == {"type": "exit", "exit_code": 1}
        assert "invalid shell call" in entry["stderr"]
        assert '{"commands": ["ls -la"]}' in entry["stderr"]  # how to call it instead
        return say("Sorry, my call was malformed.")

    env.llm.script(call("shell", broken), check)
    r = env.client.responses.create(model=MODELS[dialect], input="list files", tools=SHELL_AUTO)
    assert r.status == "completed"
    assert [i.type for i in r.output] == ["shell_call", "shell_call_output", "message"]
    assert r.output[1].status == "incomplete"
    assert r.output_text == "Sorry, my call was malformed."
    env.llm.done()


def test_unknown_tool_and_bad_command_list_are_answered(env: LLMEnv) -> None:
    def check(seen: Seen) -> Reply:
        results = {o["call_id"]: o["result"] for o in seen.outputs()}
        assert "there is no tool named 'python'" in results["call_py"]
        [entry] = results["call_big"]
        assert "at most 100 are allowed" in entry["stderr"]
        return say("ok")

    two = Reply(
        calls=[
            Call("python", {"code": "1+1"}, "call_py"),
            Call("shell", {"commands": ["true"] * 101}, "call_big"),
        ]
    )
    env.llm.script(two, check)
    r = env.client.responses.create(model=MODELS["chat"], input="x", tools=SHELL_AUTO)
    assert r.status == "completed"
    assert [i.type for i in r.output] == [
        "function_call",
        "shell_call",
        "function_call_output",
        "shell_call_output",
        "message",
    ]
    env.llm.done()


def test_default_upstream_gets_its_key_and_the_model_name(env: LLMEnv) -> None:
    def check(seen: Seen) -> Reply:
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {DEFAULT_KEY}"
        assert seen.body["model"] == "any-other-model"
        assert "tools" not in seen.body  # none were offered
        return say("hello")

    env.llm.script(check)
    r = env.client.responses.create(model="any-other-model", input="hi")
    assert (r.model, r.output_text, r.status) == ("any-other-model", "hello", "completed")
    env.llm.done()


def test_mapped_model_uses_its_own_upstream_settings(env: LLMEnv) -> None:
    def check(seen: Seen) -> Reply:
        assert seen.path == "/v1/responses"
        assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert seen.body["model"] == "stub-responses-model"
        assert seen.body["store"] is False
        assert seen.body["tools"] == [{"type": "shell", "environment": {"type": "local"}}]
        return say("hello")

    env.llm.script(check)
    r = env.client.responses.create(model=MODELS["responses"], input="hi", tools=SHELL_AUTO)
    assert r.output_text == "hello"
    env.llm.done()


def test_repeated_call_ids_are_made_unique(env: LLMEnv) -> None:
    """Some servers number tool calls per turn; the conversation still pairs up."""

    def second(seen: Seen) -> Reply:
        [first_call] = seen.body["messages"][2]["tool_calls"]
        assert first_call["id"] == "call_0"
        return shell("echo b", call_id="call_0")

    def third(seen: Seen) -> Reply:
        ids = [m["tool_call_id"] for m in seen.body["messages"] if m["role"] == "tool"]
        assert ids[0] == "call_0" and ids[1] != "call_0" and ids[1].startswith("call_")
        assert seen.last_result()[0]["stdout"] == "b\n"
        return say("ok")

    env.llm.script(shell("echo a", call_id="call_0"), second, third)
    r = env.client.responses.create(model=MODELS["chat"], input="x", tools=SHELL_AUTO)
    ids = [i.call_id for i in r.output if i.type == "shell_call"]
    assert ids[0] == "call_0" and ids[1] not in ("call_0", None)
    env.llm.done()


def test_sandbox_time_cap_clamps_and_stops(env: LLMEnv) -> None:
    three = Reply(
        calls=[
            Call("shell", {"commands": ["sleep 2.5; echo slept"]}),
            Call("shell", {"commands": ["sleep 10; echo never"], "timeout_ms": 60_000}),
            Call("shell", {"commands": ["echo not run"]}),
        ]
    )
    env.llm.script(three)
    started = time.monotonic()
    r = env.client.responses.create(model=MODELS["chat"], input="x", tools=SHELL_AUTO)
    elapsed = time.monotonic() - started
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_sandbox_time"
    first, second, third = (i for i in r.output if i.type == "shell_call_output")
    assert first.output[0].stdout == "slept\n"
    # The second command's timeout was cut to what was left of the 4 s.
    assert second.output[0].outcome.type == "timeout"
    assert third.status == "incomplete"
    assert "4 s of sandbox time" in third.output[0].stderr
    assert elapsed < MAX_SANDBOX_S + 2
    env.llm.done()


def test_tool_output_cap_stops(env: LLMEnv) -> None:
    big = "head -c 70000 /dev/zero | tr '\\0' a"
    args = {"commands": [big], "max_output_length": 65_536}
    env.llm.script(Reply(calls=[Call("shell", args) for _ in range(4)]))
    r = env.client.responses.create(model=MODELS["chat"], input="x", tools=SHELL_AUTO)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_tool_output"
    outputs = [i for i in r.output if i.type == "shell_call_output"]
    assert all(60_000 < len(o.output[0].stdout) <= 65_536 for o in outputs[:3])
    assert "not run" in outputs[3].output[0].stderr
    env.llm.done()


# -- whatever a client sends, a 4xx: never a 500 --------------------------------------------------

KEYS = [
    "type", "role", "content", "call_id", "id", "action", "commands", "output", "name",
    "arguments", "environment", "container_id", "operation", "text", "input", "source",
    "tool_use_id", "stdout", "stderr", "outcome", "status", "path", "diff", "skills",
    "network_policy", "memory_limit", "file_ids", "input_schema", "parameters",
]  # fmt: skip
TOP = [
    "model", "input", "instructions", "tools", "tool_choice", "previous_response_id", "store",
    "stream", "max_tool_calls", "temperature", "messages", "system", "max_tokens", "container",
    "metadata", "parallel_tool_calls", "text", "reasoning", "background",
]  # fmt: skip
WORDS = st.sampled_from(
    ["shell", "message", "user", "assistant", "shell_call", "shell_call_output", "function",
     "container_auto", "container_reference", "local", "text", "tool_use", "server_tool_use",
     "shell_tool_result", "tool_result", "image", "local_shell_call_output", "apply_patch",
     "shell_20250101", "input_text", "function_call", "auto", "required", "none", "any", "tool"]
)  # fmt: skip
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | WORDS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=12,
)


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.dictionaries(st.sampled_from(TOP), JSON, max_size=7),
    path=st.sampled_from(["/v1/responses", "/v1/messages"]),
)
def test_malformed_requests_are_4xx(http: httpx.Client, body: dict[str, Any], path: str) -> None:
    # The shared server has no upstream: a request that parses stops at "model not available".
    r = http.post(path, json=body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert "error" in r.json()
