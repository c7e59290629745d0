"""OpenRouter's ``openrouter:shell`` server tool on /v1/responses and /v1/messages, driven by
the official openai and anthropic SDKs against the scripted upstream: two-turn conversations,
streamed and not, with container_auto and container_reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from test_responses_upstream import MODELS, LLMEnv, Reply, Seen, llm_env, say, shell

OR_AUTO = [{"type": "openrouter:shell", "parameters": {"engine": "openrouter"}}]


def or_reference(cid: str) -> list[dict[str, Any]]:
    env = {"type": "container_reference", "container_id": cid}
    return [{"type": "openrouter:shell", "parameters": {"environment": env}}]


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


@pytest.fixture(scope="session")
def claude(env: LLMEnv) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=env.server.root_url, api_key=env.api_key, max_retries=0)
    yield client
    client.close()


OK = {"type": "exit", "exit_code": 0}


def write_then_say() -> list[Any]:
    """Turn one: the model writes a file in two commands, then answers."""

    def first(seen: Seen) -> Reply:
        assert seen.tool_names() == ["shell"]  # the model sees the hosted shell
        return shell("mkdir -p out && printf 'a,b\\n1,2\\n' > out/report.csv", "cat out/report.csv")

    def second(seen: Seen) -> Reply:
        made, cat = seen.last_result()
        assert made["outcome"] == OK and cat["stdout"] == "a,b\n1,2\n"
        return say("Wrote out/report.csv.")

    return [first, second]


def read_again() -> list[Any]:
    """Turn two: the model reads the file the first turn wrote (same container)."""

    def first(seen: Seen) -> Reply:
        return shell("wc -l out/report.csv")

    def second(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["stdout"] == "2 out/report.csv\n"
        return say("Two lines.")

    return [first, second]


def check_item(item: dict[str, Any], commands: int) -> str:
    """An ``openrouter:shell`` item as the page shows it; returns its container_id."""
    assert item["type"] == "openrouter:shell"
    assert item["status"] == "completed"
    assert item["id"] and item["call_id"]
    assert len(item["action"]["commands"]) == commands
    assert len(item["output"]) == commands
    for entry in item["output"]:
        assert set(entry) == {"stdout", "stderr", "outcome"}
    cid = item["container_id"]
    assert isinstance(cid, str) and cid.startswith("cntr_")
    assert item["max_output_length"] == 16384
    for cite in item["files"]:
        assert set(cite) == {
            "type",
            "container_id",
            "file_id",
            "filename",
            "start_index",
            "end_index",
        }
        assert cite["type"] == "container_file_citation" and cite["container_id"] == cid
    return str(cid)


def check_file(env: LLMEnv, item: dict[str, Any]) -> None:
    """The file the command wrote is cited and can be downloaded."""
    cid = item["container_id"]
    [cite] = [c for c in item["files"] if c["filename"] == "report.csv"]
    content = env.client.containers.files.content.retrieve(cite["file_id"], container_id=cid)
    assert content.read() == b"a,b\n1,2\n"


# -- Responses ---------------------------------------------------------------------------------


def test_responses_two_turns_container_auto(env: LLMEnv) -> None:
    env.llm.script(*write_then_say())
    r = env.client.responses.create(
        model=MODELS["chat"], input="make a report", tools=OR_AUTO
    ).to_dict(warnings=False)
    env.llm.done()
    assert r["status"] == "completed"
    assert [i["type"] for i in r["output"]] == ["openrouter:shell", "message"]
    item = r["output"][0]
    cid = check_item(item, 2)
    assert item["output"][1]["stdout"] == "a,b\n1,2\n"
    check_file(env, item)
    assert r["tools"] == OR_AUTO  # echoed as sent
    # The final message does not cite the files (the item does), as OpenRouter's page says.
    assert r["output"][1]["content"][0]["annotations"] == []
    assert env.client.responses.retrieve(r["id"]).to_dict(warnings=False) == r  # stored as shown

    # Turn two continues in the same container.
    env.llm.script(*read_again())
    r2 = env.client.responses.create(
        model=MODELS["chat"],
        input="how many lines?",
        tools=OR_AUTO,
        previous_response_id=r["id"],
    ).to_dict(warnings=False)
    env.llm.done()
    assert check_item(r2["output"][0], 1) == cid
    assert r2["output"][0]["output"][0]["stdout"] == "2 out/report.csv\n"
    assert r2["output"][1]["content"][0]["text"] == "Two lines."


def stream_events(env: LLMEnv, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    events = []
    with env.client.responses.create(stream=True, **kwargs) as stream:
        for event in stream:
            events.append(event.to_dict(warnings=False))
    final = events[-1]
    assert final["type"] == "response.completed", final
    return events, final["response"]


def check_stream(events: list[dict[str, Any]], response: dict[str, Any]) -> None:
    """One output_index per item; the openrouter:shell item goes through the native shell
    item's events there, and ends whole; sequence numbers count up from 0."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    at0 = [e["type"] for e in events if e.get("output_index") == 0]
    assert at0[0] == "response.output_item.added" and at0[-1] == "response.output_item.done"
    assert "response.shell_call_command.done" in at0
    assert "response.shell_call_output_content.done" in at0
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "openrouter:shell"
    assert added["item"]["status"] == "in_progress" and added["item"]["output"] == []
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in done] == list(range(len(response["output"])))
    assert [e["item"] for e in done] == response["output"]
    outputs = [e for e in events if e["type"].startswith("response.shell_call_output_content")]
    assert all(e["item_id"] == response["output"][0]["id"] for e in outputs)


def test_responses_two_turns_streamed_container_reference(env: LLMEnv) -> None:
    c = env.client.containers.create(name="or-ref")
    env.llm.script(*write_then_say())
    events, r = stream_events(
        env, model=MODELS["responses"], input="make a report", tools=or_reference(c.id)
    )
    env.llm.done()
    check_stream(events, r)
    item = r["output"][0]
    assert check_item(item, 2) == c.id
    check_file(env, item)

    # Turn two sends the first turn's items back as input (no previous_response_id).
    env.llm.script(*read_again())
    events, r2 = stream_events(
        env,
        model=MODELS["responses"],
        input=[
            {"role": "user", "content": "make a report"},
            *r["output"],
            {"role": "user", "content": "how many lines?"},
        ],
        tools=or_reference(c.id),
    )
    seen = env.llm.done()
    check_stream(events, r2)
    # The upstream got the first turn as the native call and output.
    kinds = [i.get("type") for i in seen[0].body["input"]]
    assert kinds.count("shell_call") == 1 and kinds.count("shell_call_output") == 1
    assert check_item(r2["output"][0], 1) == c.id


def test_responses_streamed_container_auto_matches_plain(env: LLMEnv) -> None:
    env.llm.script(*write_then_say())
    events, r = stream_events(env, model=MODELS["chat"], input="make a report", tools=OR_AUTO)
    env.llm.done()
    check_stream(events, r)
    check_file(env, r["output"][0])


def error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code >= 400, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_bad_openrouter_tools_are_400s(env: LLMEnv, path: str) -> None:
    base: dict[str, Any] = {"model": MODELS["chat"], "max_tokens": 64}
    if path == "/v1/responses":
        base = {"model": MODELS["chat"], "input": "hi"}
    else:
        base["messages"] = [{"role": "user", "content": "hi"}]
    local = {"type": "openrouter:shell", "parameters": {"environment": {"type": "local"}}}
    engine = {"type": "openrouter:shell", "parameters": {"engine": "openai"}}
    with env.http() as http:
        r = http.post(path, json={**base, "tools": [local]})
        assert r.status_code == 400
        assert "'local' environments are not supported" in error(r)["message"]
        assert error(r)["param"] == "tools[0].parameters.environment.type"
        r = http.post(path, json={**base, "tools": [engine]})
        assert r.status_code == 400 and "engine" in error(r)["message"]
        native = {"type": "shell"} if path == "/v1/responses" else {"type": "shell_20250101"}
        r = http.post(path, json={**base, "tools": [*OR_AUTO, native]})
        assert r.status_code == 400 and "one shell tool" in error(r)["message"]


def test_legacy_sleep_after_seconds_is_accepted_and_clamps_apply(env: LLMEnv) -> None:
    tool = {
        "type": "openrouter:shell",
        "parameters": {"sleep_after_seconds": 5, "environment": {"type": "container_auto"}},
    }

    def first(seen: Seen) -> Reply:
        # tool_choice {"type": "openrouter:shell"} forces the shell
        assert seen.body["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
        return shell("echo hi", timeout_ms=10_000_000, max_output_length=10_000_000)

    env.llm.script(first, say("done"))
    r = env.client.responses.create(
        model=MODELS["chat"],
        input="hi",
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "openrouter:shell"},  # type: ignore[misc,typeddict-item]
    ).to_dict(warnings=False)
    env.llm.done()
    item = r["output"][0]
    assert item["output"][0]["stdout"] == "hi\n"
    assert item["max_output_length"] == 65536  # clamped, as the native tool's


def test_a_different_network_policy_on_the_warm_container_is_a_409(env: LLMEnv) -> None:
    env.llm.script(shell("true"), say("ok"))
    first = env.client.responses.create(model=MODELS["chat"], input="hi", tools=OR_AUTO)
    env.llm.done()
    policy = {"type": "allowlist", "allowed_domains": ["pypi.org"]}
    tools = [
        {
            "type": "openrouter:shell",
            "parameters": {"environment": {"type": "container_auto", "network_policy": policy}},
        }
    ]
    with env.http() as http:
        r = http.post(
            "/v1/responses",
            json={
                "model": MODELS["chat"],
                "input": "again",
                "tools": tools,
                "previous_response_id": first.id,
            },
        )
    assert r.status_code == 409, r.text
    assert r.headers["x-should-retry"] == "false"
    assert "policy cannot change" in error(r)["message"]


# -- Messages ----------------------------------------------------------------------------------


def check_blocks(blocks: list[dict[str, Any]], commands: int) -> dict[str, Any]:
    """server_tool_use named openrouter:shell, then its openrouter_shell_tool_result; returns
    the result's content."""
    use, result = blocks
    assert use["type"] == "server_tool_use" and use["name"] == "openrouter:shell"
    assert len(use["input"]["commands"]) == commands
    assert result["type"] == "openrouter_shell_tool_result"
    assert result["tool_use_id"] == use["id"]
    content: dict[str, Any] = result["content"]
    assert len(content["output"]) == commands
    assert content["container_id"].startswith("cntr_")
    return content


def test_messages_two_turns_container_auto(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    env.llm.script(*write_then_say())
    ask: dict[str, Any] = dict(model=MODELS["chat"], max_tokens=256, tools=OR_AUTO)
    first = [{"role": "user", "content": "make a report"}]
    m = claude.messages.create(messages=first, **ask).model_dump(warnings=False)  # type: ignore[arg-type]
    env.llm.done()
    assert [b["type"] for b in m["content"]] == [
        "server_tool_use",
        "openrouter_shell_tool_result",
        "text",
    ]
    content = check_blocks(m["content"][:2], 2)
    assert content["output"][1]["stdout"] == "a,b\n1,2\n"
    check_file(env, content)
    cid = m["container"]["id"]
    assert content["container_id"] == cid

    # Turn two: the blocks go back as they are, in the same container.
    env.llm.script(*read_again())
    follow = claude.messages.create(  # type: ignore[call-overload]
        messages=[
            *first,
            {"role": "assistant", "content": m["content"]},
            {"role": "user", "content": "how many lines?"},
        ],
        container=cid,
        **ask,
    ).model_dump(warnings=False)
    seen = env.llm.done()
    roles = [msg["role"] for msg in seen[0].body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    content = check_blocks(follow["content"][:2], 1)
    assert content["container_id"] == cid
    assert content["output"][0]["stdout"] == "2 out/report.csv\n"


def test_messages_streamed_container_reference(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    c = env.client.containers.create(name="or-msg")
    env.llm.script(*write_then_say())
    with claude.messages.stream(  # type: ignore[call-overload]
        model=MODELS["chat"],
        max_tokens=256,
        messages=[{"role": "user", "content": "make a report"}],
        tools=or_reference(c.id),
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message().model_dump(warnings=False)
    env.llm.done()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    content = check_blocks(final["content"][:2], 2)
    assert content["container_id"] == c.id
    check_file(env, content)

    env.llm.script(*read_again())
    with claude.messages.stream(  # type: ignore[call-overload]
        model=MODELS["chat"],
        max_tokens=256,
        messages=[
            {"role": "user", "content": "make a report"},
            {"role": "assistant", "content": final["content"]},
            {"role": "user", "content": "how many lines?"},
        ],
        tools=or_reference(c.id),
    ) as stream:
        final2 = stream.get_final_message().model_dump(warnings=False)
    env.llm.done()
    content = check_blocks(final2["content"][:2], 1)
    assert content["output"][0]["stdout"] == "2 out/report.csv\n"
