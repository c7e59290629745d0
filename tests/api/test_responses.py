"""POST /v1/responses with the server-side shell loop, driven by the official openai SDK
against a shellbox server whose model is the scripted upstream (both dialects)."""

from __future__ import annotations

import base64
import io
import json
import secrets
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import openai
import pytest
from api_helpers import WAIT_S, host_pids, wait_until
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from test_responses_upstream import (
    MAX_ITERATIONS,
    MODELS,
    SHELL_AUTO,
    Call,
    LLMEnv,
    Reply,
    Seen,
    call,
    llm_env,
    say,
    shell,
)

DIALECTS = ["chat", "responses"]


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


def ok(entry: dict[str, Any]) -> bool:
    return bool(entry["outcome"] == {"type": "exit", "exit_code": 0})


def test_one_shot_container_auto_writes_and_cites_a_file(env: LLMEnv) -> None:
    for dialect in DIALECTS:
        one_shot(env, dialect)


def one_shot(env: LLMEnv, dialect: str) -> None:
    def first(seen: Seen) -> Reply:
        assert seen.dialect == dialect
        assert seen.tool_names() == ["shell"]
        if dialect == "chat":
            params = seen.tool("shell")["parameters"]
            assert params["required"] == ["commands"]
            assert params["properties"]["commands"]["type"] == "array"
            assert set(params["properties"]) == {"commands", "timeout_ms", "max_output_length"}
            assert seen.body["tool_choice"] == "auto"
        else:
            assert seen.tool("shell") == {"type": "shell", "environment": {"type": "local"}}
        system = seen.system()
        assert system.startswith("Be brief.")
        assert "/mnt/data" in system and "no network access" in system
        assert seen.user_texts() == ["Make a CSV of two rows."]
        return shell(
            "ls -la /mnt/data", "printf 'a,b\\n1,2\\n' > /mnt/data/out.csv", "wc -l out.csv"
        )

    def second(seen: Seen) -> Reply:
        listing, write, count = seen.last_result()
        assert all(ok(e) for e in (listing, write, count)), seen.last_result()
        assert "total" in listing["stdout"]
        assert count["stdout"] == "2 out.csv\n"
        return say("I wrote /mnt/data/out.csv with two rows.", usage=(150, 12))

    env.llm.script(first, second)
    r = env.client.responses.create(
        model=MODELS[dialect],
        instructions="Be brief.",
        input="Make a CSV of two rows.",
        tools=SHELL_AUTO,
    )
    assert r.status == "completed", r
    assert r.id.startswith("resp_")
    assert [i.type for i in r.output] == ["shell_call", "shell_call_output", "message"]
    sh, out, msg = r.output
    assert sh.action.commands[1] == "printf 'a,b\\n1,2\\n' > /mnt/data/out.csv"
    assert sh.status == "completed"
    assert sh.environment is not None and sh.environment.type == "container_reference"
    cid = sh.environment.container_id
    assert env.client.containers.retrieve(cid).status == "running"
    assert out.call_id == sh.call_id
    assert [e.outcome.type for e in out.output] == ["exit", "exit", "exit"]
    assert out.output[2].stdout == "2 out.csv\n"
    assert out.max_output_length == 16384
    # The final message cites the file it created, at its mention in the text.
    text = msg.content[0]
    assert text.text == "I wrote /mnt/data/out.csv with two rows."
    [cite] = text.annotations
    assert cite.type == "container_file_citation"
    assert (cite.container_id, cite.filename) == (cid, "out.csv")
    assert text.text[cite.start_index : cite.end_index] == "/mnt/data/out.csv"
    content = env.client.containers.files.content.retrieve(cite.file_id, container_id=cid)
    assert content.read() == b"a,b\n1,2\n"
    # Usage adds up both turns.
    assert r.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (250, 22, 272)
    # Stored as it was returned; and every field has the type the SDK declares.
    assert env.client.responses.retrieve(r.id).model_dump() == r.model_dump()
    with env.http() as http:
        Response.model_validate(http.get(f"/v1/responses/{r.id}").json())
    env.llm.done()


def test_container_reference_runs_in_that_container(env: LLMEnv) -> None:
    c = env.client.containers.create(name="ref")
    env.client.containers.files.create(c.id, file=("hello.txt", io.BytesIO(b"hello there\n")))

    def first(seen: Seen) -> Reply:
        assert "/mnt/data" in seen.system()
        return shell("cat hello.txt", "whoami")

    def second(seen: Seen) -> Reply:
        cat, who = seen.last_result()
        assert cat["stdout"] == "hello there\n"
        assert who["stdout"] != "root\n"
        return say("It says hello there.")

    env.llm.script(first, second)
    tools = [
        {"type": "shell", "environment": {"type": "container_reference", "container_id": c.id}}
    ]
    r = env.client.responses.create(model=MODELS["chat"], input="read it", tools=tools)
    assert r.status == "completed"
    assert r.output[0].environment.container_id == c.id
    assert r.output[1].output[0].stdout == "hello there\n"
    assert r.output_text == "It says hello there."
    assert r.tools[0].environment.type == "container_reference"  # the tools as sent
    env.llm.done()


def test_container_auto_options(env: LLMEnv) -> None:
    """file_ids are copied in, memory_limit applies, and the container is reported."""
    f = env.client.files.create(
        file=("data.txt", io.BytesIO(b"from the files api\n")), purpose="user_data"
    )

    def first(seen: Seen) -> Reply:
        return shell("cat data.txt")

    def second(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["stdout"] == "from the files api\n"
        return say("read it")

    env.llm.script(first, second)
    tools = [
        {
            "type": "shell",
            "environment": {"type": "container_auto", "file_ids": [f.id], "memory_limit": "4g"},
        }
    ]
    r = env.client.responses.create(model=MODELS["chat"], input="read data.txt", tools=tools)
    cid = r.output[0].environment.container_id
    container = env.client.containers.retrieve(cid)
    assert (container.memory_limit, container.name) == ("4g", r.id)
    env.llm.done()


def test_previous_response_id_continues_in_the_same_container(env: LLMEnv) -> None:
    env.llm.script(shell("echo remembered > note.txt"), say("Saved."))
    first = env.client.responses.create(model=MODELS["chat"], input="save a note", tools=SHELL_AUTO)
    cid = first.output[0].environment.container_id

    def check(seen: Seen) -> Reply:
        assert seen.user_texts() == ["save a note", "read it back"]
        assert seen.system() != ""  # the environment note; instructions are not carried
        messages = seen.body["messages"]
        assert [m["role"] for m in messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]
        assert messages[2]["tool_calls"][0]["function"]["name"] == "shell"
        assert messages[4]["content"] == "Saved."
        return shell("cat note.txt")

    def answer(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["stdout"] == "remembered\n"
        return say("It says remembered.")

    env.llm.script(check, answer)
    second = env.client.responses.create(
        model=MODELS["chat"],
        previous_response_id=first.id,
        input="read it back",
        tools=SHELL_AUTO,
    )
    assert second.previous_response_id == first.id
    assert second.output[0].environment.container_id == cid
    assert second.output_text == "It says remembered."
    env.llm.done()

    # The warm container keeps its network policy: another one is a 409, never retried.
    env.llm.script()
    policy = {"type": "allowlist", "allowed_domains": ["pypi.org"]}
    with env.http() as http:
        r = http.post(
            "/v1/responses",
            json={
                "model": MODELS["chat"],
                "previous_response_id": second.id,
                "input": "install something",
                "tools": [
                    {
                        "type": "shell",
                        "environment": {"type": "container_auto", "network_policy": policy},
                    }
                ],
            },
        )
    assert r.status_code == 409, r.text
    assert r.headers["x-should-retry"] == "false"
    error = r.json()["error"]
    assert cid in error["message"] and "network" in error["message"]
    with pytest.raises(openai.ConflictError):
        env.client.responses.create(
            model=MODELS["chat"],
            previous_response_id=second.id,
            input="again",
            tools=[
                {
                    "type": "shell",
                    "environment": {"type": "container_auto", "network_policy": policy},
                }
            ],
        )
    assert env.llm.done() == []  # the model was never asked


def inline_skill(name: str, description: str, body: str) -> dict[str, Any]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(
            f"{name}/SKILL.md", f"---\nname: {name}\ndescription: {description}\n---\n{body}"
        )
    data = base64.b64encode(buf.getvalue()).decode()
    return {
        "type": "inline",
        "name": name,
        "description": description,
        "source": {"type": "base64", "media_type": "application/zip", "data": data},
    }


def test_mounted_skills_are_described_to_the_model(env: LLMEnv) -> None:
    skill = inline_skill("tally", "Count things in files", "Run wc -l on the file.\n")

    def first(seen: Seen) -> Reply:
        system = seen.system()
        assert "tally: Count things in files (directory: /mnt/skills/tally)" in system
        assert "SKILL.md" in system
        return shell("cat /mnt/skills/tally/SKILL.md")

    def second(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert "Run wc -l on the file." in entry["stdout"]
        return say("The skill says to use wc -l.")

    env.llm.script(first, second)
    tools = [{"type": "shell", "environment": {"type": "container_auto", "skills": [skill]}}]
    r = env.client.responses.create(model=MODELS["chat"], input="how do I count?", tools=tools)
    assert r.output_text == "The skill says to use wc -l."
    env.llm.done()


def test_local_environment_returns_calls_to_the_client(env: LLMEnv) -> None:
    for dialect in DIALECTS:
        local_round_trip(env, dialect)


def local_round_trip(env: LLMEnv, dialect: str) -> None:
    skill = {"name": "csv-tools", "description": "Work with CSV files", "path": "/opt/skills/csv"}

    def first(seen: Seen) -> Reply:
        system = seen.system()
        assert "csv-tools: Work with CSV files (directory: /opt/skills/csv)" in system
        assert "/mnt/data" not in system  # nothing runs in a container
        if dialect == "chat":
            assert "user's machine" in seen.tool("shell")["description"]
        return shell("uname -a", call_id="call_local1")

    env.llm.script(first)
    tools = [{"type": "shell", "environment": {"type": "local", "skills": [skill]}}]
    r = env.client.responses.create(model=MODELS[dialect], input="what OS?", tools=tools)
    assert r.status == "completed"
    [sh] = r.output
    assert sh.type == "shell_call" and sh.call_id == "call_local1"
    assert sh.environment is not None and sh.environment.type == "local"
    assert sh.action.commands == ["uname -a"]

    # Continuing without the output is a clear 400.
    with pytest.raises(openai.BadRequestError) as info:
        env.client.responses.create(
            model=MODELS[dialect], previous_response_id=r.id, input="and?", tools=tools
        )
    assert "No tool output found for shell_call 'call_local1'" in info.value.message

    def second(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry == {
            "stdout": "Linux box 6.1\n",
            "stderr": "",
            "outcome": {"type": "exit", "exit_code": 0},
        }
        return say("Linux.")

    env.llm.script(second)
    # As the Agents SDK sends it: no status, no max_output_length (wire spec section 7).
    output = {
        "type": "shell_call_output",
        "call_id": "call_local1",
        "output": [
            {"stdout": "Linux box 6.1\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
        ],
    }
    r2 = env.client.responses.create(
        model=MODELS[dialect], previous_response_id=r.id, input=[output], tools=tools
    )
    assert r2.output_text == "Linux."
    assert [i.type for i in r2.output] == ["message"]
    env.llm.done()


def test_replayed_items_are_accepted_as_input(env: LLMEnv) -> None:
    """A client that keeps the conversation itself sends earlier items back, with their ids,
    without created_by, and local_shell_call_output linked by call_id only."""

    def check(seen: Seen) -> Reply:
        results = {o["call_id"]: o["result"] for o in seen.outputs()}
        assert results["call_a"][0]["stdout"] == "a\n"
        assert results["call_b"] == {"stdout": "b\n"}  # the text the client sent, as is
        assert results["call_c"] == {"status": "completed", "output": "Created x.txt"}
        return say("done")

    env.llm.script(check)
    items = [
        {"role": "user", "content": "go"},
        {
            "type": "shell_call",
            "id": "sh_old",
            "call_id": "call_a",
            "status": "completed",
            "action": {"commands": ["echo a"], "timeout_ms": None, "max_output_length": None},
        },
        {
            "type": "shell_call_output",
            "id": "sho_old",
            "call_id": "call_a",
            "output": [
                {"stdout": "a\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        },
        {
            "type": "local_shell_call",
            "id": "lsh_old",
            "call_id": "call_b",
            "status": "completed",
            "action": {"type": "exec", "command": ["echo", "b"], "env": {}},
        },
        {"type": "local_shell_call_output", "call_id": "call_b", "output": '{"stdout": "b\\n"}'},
        {
            "type": "apply_patch_call",
            "id": "apc_old",
            "call_id": "call_c",
            "status": "completed",
            "operation": {"type": "create_file", "path": "x.txt", "diff": "+x\n"},
        },
        {
            "type": "apply_patch_call_output",
            "call_id": "call_c",
            "status": "completed",
            "output": "Created x.txt",
        },
    ]
    tools = [
        {"type": "shell", "environment": {"type": "local"}},
        {"type": "local_shell"},
        {"type": "apply_patch"},
    ]
    r = env.client.responses.create(model=MODELS["chat"], input=items, tools=tools)
    assert r.output_text == "done"
    env.llm.done()


def test_iteration_cap_ends_incomplete(env: LLMEnv) -> None:
    env.llm.script(*[shell(f"echo round {n}") for n in range(MAX_ITERATIONS)])
    r = env.client.responses.create(model=MODELS["chat"], input="loop", tools=SHELL_AUTO)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_tool_iterations"
    assert [i.type for i in r.output] == ["shell_call", "shell_call_output"] * MAX_ITERATIONS
    assert r.output[-1].output[0].stdout == f"round {MAX_ITERATIONS - 1}\n"
    assert len(env.llm.done()) == MAX_ITERATIONS
    assert env.client.responses.retrieve(r.id).status == "incomplete"

    # Streamed, the run ends with response.incomplete.
    env.llm.script(*[shell("true") for _ in range(MAX_ITERATIONS)])
    events = list(
        env.client.responses.create(
            model=MODELS["chat"], input="loop", tools=SHELL_AUTO, stream=True
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_tool_iterations"
    env.llm.done()


def test_max_tool_calls_stops_running_tools(env: LLMEnv) -> None:
    two = Reply(
        calls=[Call("shell", {"commands": ["echo 1"]}), Call("shell", {"commands": ["echo 2"]})]
    )

    def check(seen: Seen) -> Reply:
        first, second = seen.outputs()
        assert first["result"][0]["stdout"] == "1\n"
        assert "not run: at most 1 tool calls" in second["result"][0]["stderr"]
        assert seen.body["tool_choice"] == "none"
        return say("stopped")

    env.llm.script(two, check)
    r = env.client.responses.create(
        model=MODELS["chat"], input="x", tools=SHELL_AUTO, max_tool_calls=1
    )
    assert r.status == "completed"
    assert r.max_tool_calls == 1
    assert r.output[3].status == "incomplete"
    env.llm.done()


def test_function_tools_go_back_to_the_client(env: LLMEnv) -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }

    def first(seen: Seen) -> Reply:
        assert seen.tool_names() == ["shell", "get_weather"]
        assert seen.tool("get_weather")["parameters"] == weather["parameters"]
        assert seen.body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        return Reply(
            calls=[
                Call("shell", {"commands": ["echo from-shell"]}, "call_sh"),
                Call("get_weather", {"city": "Paris"}, "call_w"),
            ]
        )

    env.llm.script(first)
    tools = [*SHELL_AUTO, weather]
    r = env.client.responses.create(
        model=MODELS["chat"],
        input="weather?",
        tools=tools,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    # The hosted call ran; the function call waits for the client.
    assert r.status == "completed"
    assert [i.type for i in r.output] == ["shell_call", "function_call", "shell_call_output"]
    fc = r.output[1]
    assert (fc.name, json.loads(fc.arguments), fc.call_id) == (
        "get_weather",
        {"city": "Paris"},
        "call_w",
    )

    def second(seen: Seen) -> Reply:
        results = {o["call_id"]: o["result"] for o in seen.outputs()}
        assert results["call_w"] == "sunny"
        assert results["call_sh"][0]["stdout"] == "from-shell\n"
        assert seen.body["tool_choice"] == "auto"
        return say("It is sunny.")

    env.llm.script(second)
    r2 = env.client.responses.create(
        model=MODELS["chat"],
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": "call_w", "output": "sunny"}],
        tools=tools,
    )
    assert r2.output_text == "It is sunny."
    assert r2.output[0].type == "message"
    env.llm.done()


def test_hosted_apply_patch(env: LLMEnv) -> None:
    def first(seen: Seen) -> Reply:
        assert seen.tool_names() == ["shell", "apply_patch"]
        return call(
            "apply_patch",
            {"operation": "create_file", "path": "hello.py", "diff": "+print('hi from patch')\n"},
        )

    def second(seen: Seen) -> Reply:
        result = seen.last_result()
        assert result == {"status": "completed", "output": "Created hello.py"}, result
        return shell("python3 hello.py")

    def third(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["stdout"] == "hi from patch\n"
        return say("hello.py works.")

    for dialect in DIALECTS:
        env.llm.script(first, second, third)
        r = env.client.responses.create(
            model=MODELS[dialect], input="write it", tools=[*SHELL_AUTO, {"type": "apply_patch"}]
        )
        assert [i.type for i in r.output] == [
            "apply_patch_call",
            "apply_patch_call_output",
            "shell_call",
            "shell_call_output",
            "message",
        ]
        assert r.output[1].status == "completed"
        env.llm.done()


def normalized(response: Any, *, blank_ids: bool = True) -> Any:
    """A response as JSON, without what differs between two runs (ids, times, containers)
    and without the ``parsed`` fields the SDK's stream helper adds to what it assembles."""
    data = response.model_dump() if hasattr(response, "model_dump") else response
    keys = ("id", "call_id", "created_at", "completed_at", "container_id", "file_id")
    keys = keys if blank_ids else ()

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: ("*" if k in keys and x is not None else walk(x))
                for k, x in v.items()
                if k != "parsed"
            }
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(data)


def stream_script() -> list[Any]:
    return [
        Reply(
            text="Let me look.",
            calls=[Call("shell", {"commands": ["echo -n hi; echo there >&2", "seq 3 > n.txt"]})],
        ),
        shell("cat n.txt", "sleep 5", timeout_ms=300),
        say("Wrote n.txt; the second command timed out."),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_streamed_and_non_streamed_runs_agree(env: LLMEnv, dialect: str) -> None:
    kwargs: dict[str, Any] = {"model": MODELS[dialect], "input": "go", "tools": SHELL_AUTO}
    env.llm.script(*stream_script())
    plain = env.client.responses.create(**kwargs)
    # Unstreamed, the upstream is asked for whole answers, as it always was.
    assert all("stream" not in seen.body for seen in env.llm.done())
    assert plain.output[4].output[1].outcome.type == "timeout"

    env.llm.script(*stream_script())
    with env.client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    # Streamed, every turn is streamed from the upstream (and answered as a stream).
    for seen in env.llm.done():
        assert seen.body["stream"] is True
        if dialect == "chat":
            assert seen.body["stream_options"] == {"include_usage": True}
    for streamed_item, plain_item in zip(final.output, plain.output, strict=True):
        assert normalized(streamed_item) == normalized(plain_item)
    assert normalized(final) == normalized(plain)
    stored = env.client.responses.retrieve(final.id)
    assert normalized(final, blank_ids=False) == normalized(stored, blank_ids=False)

    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    for kind in (
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.shell_call_command.added",
        "response.shell_call_command.delta",
        "response.shell_call_command.done",
        "response.shell_call_output_content.delta",
        "response.shell_call_output_content.done",
        "response.output_text.annotation.added",
    ):
        assert kind in kinds, kind
    commands = [e.command for e in events if e.type == "response.shell_call_command.done"]
    assert commands == ["echo -n hi; echo there >&2", "seq 3 > n.txt", "cat n.txt", "sleep 5"]
    deltas = [
        (e.command_index, e.delta.stdout, e.delta.stderr)
        for e in events
        if e.type == "response.shell_call_output_content.delta" and e.output_index == 2
    ]
    assert (0, "hi", None) in deltas and (0, None, "there\n") in deltas
    # Every item is announced, then finished, at its index.
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    done = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    assert added == done == list(enumerate(i.type for i in final.output))
    assert [i.type for i in final.output] == [
        "message",
        "shell_call",
        "shell_call_output",
        "shell_call",
        "shell_call_output",
        "message",
    ]
    assert final.output_text == "Let me look.Wrote n.txt; the second command timed out."

    # On the wire: each SSE event names its type, and validates as the SDK declares it.
    env.llm.script(*stream_script())
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    with (
        env.http() as http,
        http.stream("POST", "/v1/responses", json={**kwargs, "stream": True}) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        blocks = "".join(r.iter_text()).strip().split("\n\n")
    env.llm.done()
    for block in blocks:
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        adapter.validate_python(event)
    assert len(blocks) == len(events)


# -- streaming from the upstream -------------------------------------------------------------


def read_releasing(stream: Iterable[Any], reply: Reply) -> list[Any]:
    """A stream's events. The upstream holds its last event back until the first text delta
    reaches us, which proves the text was not kept until the upstream's answer was whole."""
    assert reply.hold is not None
    events = []
    for event in stream:
        if event.type == "response.output_text.delta" and not reply.hold.is_set():
            assert not reply.finished.is_set(), "the text came after the upstream's last event"
            reply.hold.set()
        events.append(event)
    assert reply.hold.is_set(), "no text delta came"
    return events


@pytest.mark.parametrize("dialect", DIALECTS)
def test_text_streams_while_the_upstream_writes_it(env: LLMEnv, dialect: str) -> None:
    text = "Streaming works: one piece, then another, then the last one."
    reply = Reply(text=text, pieces=4, usage=(70, 7), hold=threading.Event())
    env.llm.script(reply)
    with env.client.responses.stream(model=MODELS[dialect], input="talk") as stream:
        events = read_releasing(stream, reply)
        final = stream.get_final_response()
    env.llm.done()
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 4
    assert "".join(deltas) == text
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == text
    assert (final.status, final.output_text) == ("completed", text)
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (70, 7)  # the last chunk's

    env.llm.script(Reply(text=text, usage=(70, 7)))
    plain = env.client.responses.create(model=MODELS[dialect], input="talk")
    env.llm.done()
    assert normalized(final) == normalized(plain)
    assert normalized(env.client.responses.retrieve(final.id)) == normalized(plain)


def test_reasoning_ahead_of_the_text_keeps_its_place(env: LLMEnv) -> None:
    """The upstream's reasoning item comes before its text: it is shown first, whole, so the
    text after it still streams, at the index the unstreamed response has it."""
    reply = Reply(reasoning="Greet them.", text="Hello, reader.", hold=threading.Event())
    env.llm.script(reply)
    with env.client.responses.stream(model=MODELS["responses"], input="hi") as stream:
        events = read_releasing(stream, reply)
        final = stream.get_final_response()
    env.llm.done()
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    assert added == [(0, "reasoning"), (1, "message")]
    assert [e.output_index for e in events if e.type == "response.output_text.delta"] == [1] * 3
    assert [i.type for i in final.output] == ["reasoning", "message"]

    env.llm.script(Reply(reasoning="Greet them.", text="Hello, reader."))
    plain = env.client.responses.create(model=MODELS["responses"], input="hi")
    env.llm.done()
    assert normalized(final) == normalized(plain)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_streamed_call_runs_once_its_arguments_are_whole(env: LLMEnv, dialect: str) -> None:
    command = "printf '%s-%s\\n' streamed arguments"
    args = {"commands": [command, "pwd"]}

    def check(seen: Seen) -> Reply:
        assert seen.body["stream"] is True
        printed, pwd = seen.last_result()
        assert printed["stdout"] == "streamed-arguments\n"
        assert pwd["stdout"] == "/mnt/data\n"
        return say("It printed streamed-arguments.")

    # In chat chunks, the arguments' JSON comes in 6 pieces.
    env.llm.script(Reply(text="Running it.", calls=[Call("shell", args)], pieces=6), check)
    with env.client.responses.stream(
        model=MODELS[dialect], input="run it", tools=SHELL_AUTO
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    env.llm.done()
    assert final.status == "completed"
    assert [i.type for i in final.output] == [
        "message",
        "shell_call",
        "shell_call_output",
        "message",
    ]
    assert final.output[1].action.commands == [command, "pwd"]
    assert final.output[2].output[0].stdout == "streamed-arguments\n"
    assert final.output_text == "Running it.It printed streamed-arguments."
    # The text streamed in pieces; the call was shown whole, after the text before it.
    deltas = [(e.output_index, e.delta) for e in events if e.type == "response.output_text.delta"]
    assert [d for i, d in deltas if i == 0] == ["Ru", "nn", "in", "g ", "it", "."]
    assert "".join(d for i, d in deltas if i == 3) == "It printed streamed-arguments."
    kinds = [e.type for e in events]
    assert kinds.index("response.output_text.done") < kinds.index(
        "response.shell_call_command.added"
    )
    commands = [e.command for e in events if e.type == "response.shell_call_command.done"]
    assert commands == [command, "pwd"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_upstream_that_ignores_stream_still_works(env: LLMEnv, dialect: str) -> None:
    """Some servers answer a streamed request with plain JSON: it is read as such."""
    env.llm.script(
        Reply(text="Plain JSON.", calls=[Call("shell", {"commands": ["echo json"]})], stream=False),
        Reply(text="Still JSON.", stream=False),
    )
    with env.client.responses.stream(model=MODELS[dialect], input="go", tools=SHELL_AUTO) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert all(seen.body["stream"] is True for seen in env.llm.done())
    assert final.status == "completed"
    assert [i.type for i in final.output] == [
        "message",
        "shell_call",
        "shell_call_output",
        "message",
    ]
    assert final.output[2].output[0].stdout == "json\n"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Plain JSON.", "Still JSON."]  # each text whole, in one delta


def test_retrieve_delete_store_and_tenancy(env: LLMEnv) -> None:
    env.llm.script(say("one"))
    r = env.client.responses.create(model=MODELS["chat"], input="hi")
    other_key = env.server.create_key("someone-else")
    other = openai.OpenAI(base_url=env.server.base_url, api_key=other_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        other.responses.create(model=MODELS["chat"], input="x", previous_response_id=r.id)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    c = env.client.containers.create(name="mine")
    tools = [
        {"type": "shell", "environment": {"type": "container_reference", "container_id": c.id}}
    ]
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=MODELS["chat"], input="x", tools=tools)
    env.client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        env.client.responses.retrieve(r.id)

    env.llm.script(say("not kept"))
    unstored = env.client.responses.create(model=MODELS["chat"], input="hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        env.client.responses.retrieve(unstored.id)
    env.llm.done()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": MODELS["chat"], "input": 3}, "input"),
        ({"model": MODELS["chat"], "input": [{"type": "web_search_call"}]}, "input[0].type"),
        (
            {"model": MODELS["chat"], "input": "x", "tools": [{"type": "web_search"}]},
            "tools[0].type",
        ),
        (
            {
                "model": MODELS["chat"],
                "input": "x",
                "tools": [
                    {
                        "type": "shell",
                        "environment": {"type": "container_auto", "memory_limit": "2g"},
                    }
                ],
            },
            "tools[0].environment.memory_limit",
        ),
        ({"model": MODELS["chat"], "input": "x", "tool_choice": {"type": "shell"}}, "tool_choice"),
        ({"model": MODELS["chat"], "input": "x", "background": True}, "background"),
        ({"model": MODELS["chat"], "input": "x", "max_tool_calls": 0}, "max_tool_calls"),
        (
            {
                "model": MODELS["chat"],
                "input": [{"type": "shell_call_output", "call_id": "c", "output": []}],
            },
            "input",
        ),
    ],
)
def test_bad_requests_are_400s(env: LLMEnv, body: dict[str, Any], param: str) -> None:
    env.llm.script()
    with env.http() as http:
        r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert env.llm.done() == []


def test_a_client_that_leaves_a_stream_stops_the_command(env: LLMEnv) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    env.llm.script(shell(f"echo go; exec -a {marker} sleep 1000", timeout_ms=120_000))
    body = {"model": MODELS["chat"], "input": "x", "tools": SHELL_AUTO, "stream": True}
    with env.http() as http, http.stream("POST", "/v1/responses", json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if '"go\\n"' in line:
                break
        assert wait_until(lambda: bool(host_pids(marker)), WAIT_S)
        lines.close()  # leaving early closes the response: the client is gone
    # The command must die long before its 120 s timeout.
    assert wait_until(lambda: not host_pids(marker), WAIT_S), host_pids(marker)
    env.llm.done()
