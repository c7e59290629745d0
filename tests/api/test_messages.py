"""POST /v1/messages: the Anthropic Messages shape with the shell server tool, driven by the
official anthropic SDK against the scripted upstream."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from test_responses_upstream import MODELS, Call, LLMEnv, Reply, Seen, llm_env, say, shell

SHELL_TOOL = {"type": "shell_20250101", "name": "shell"}


@pytest.fixture(scope="session")
def env(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


@pytest.fixture(scope="session")
def claude(env: LLMEnv) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=env.server.root_url, api_key=env.api_key, max_retries=0)
    yield client
    client.close()


def two_rounds() -> list[Any]:
    def first(seen: Seen) -> Reply:
        assert seen.tool_names() == ["shell"]
        assert seen.system().startswith("You are terse.")
        assert "/mnt/data" in seen.system()
        assert seen.body["max_tokens"] == 512
        return shell("echo one > a.txt; ls", usage=(100, 10))

    def second(seen: Seen) -> Reply:
        [entry] = seen.last_result()
        assert entry["stdout"] == "a.txt\n"
        return Reply(
            text="Now reading.", calls=[Call("shell", {"commands": ["cat a.txt", "exit 3"]})]
        )

    def third(seen: Seen) -> Reply:
        cat, fail = seen.last_result()
        assert cat["stdout"] == "one\n"
        assert fail["outcome"] == {"type": "exit", "exit_code": 3}
        return say("The file says one.", usage=(120, 8))

    return [first, second, third]


def ask(**extra: Any) -> Any:
    return dict(
        model=MODELS["chat"],
        max_tokens=512,
        system="You are terse.",
        messages=[{"role": "user", "content": "Write a file and read it."}],
        tools=[SHELL_TOOL],
        **extra,
    )


def test_two_shell_rounds(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    env.llm.script(*two_rounds())
    m = claude.messages.create(**ask())
    env.llm.done()
    assert m.id.startswith("msg_")
    assert (m.role, m.stop_reason, m.model) == ("assistant", "end_turn", MODELS["chat"])
    kinds = [b.type for b in m.content]
    assert kinds == [
        "server_tool_use",
        "shell_tool_result",
        "text",
        "server_tool_use",
        "shell_tool_result",
        "text",
    ]
    use1, result1, _, use2, result2, final = m.content
    assert (use1.name, use1.input) == ("shell", {"commands": ["echo one > a.txt; ls"]})
    assert result1.tool_use_id == use1.id  # type: ignore[union-attr]
    [entry] = result1.content["output"]  # type: ignore[union-attr]
    assert entry == {"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
    assert [f["filename"] for f in result1.content["files"]] == ["a.txt"]  # type: ignore[union-attr]
    assert use2.input == {"commands": ["cat a.txt", "exit 3"]}
    cat, fail = result2.content["output"]  # type: ignore[union-attr]
    assert cat["stdout"] == "one\n"
    assert fail["outcome"] == {"type": "exit", "exit_code": 3}
    assert final.text == "The file says one."  # type: ignore[union-attr]
    assert m.container is not None and m.container.id.startswith("cntr_")
    assert m.usage.input_tokens == 320 and m.usage.output_tokens == 28

    # The conversation goes on in the same container: the blocks are sent back as they are.
    def check(seen: Seen) -> Reply:
        roles = [msg["role"] for msg in seen.body["messages"]]
        assert roles == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]
        assert seen.body["messages"][4]["content"] == "Now reading."
        return shell("cat a.txt")

    env.llm.script(check, say("Still one."))
    follow = claude.messages.create(
        model=MODELS["chat"],
        max_tokens=512,
        messages=[
            {"role": "user", "content": "Write a file and read it."},
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": "Read it again."},
        ],
        tools=[SHELL_TOOL],
        container=m.container.id,
    )
    env.llm.done()
    assert follow.container is not None and follow.container.id == m.container.id
    assert follow.content[1].content["output"][0]["stdout"] == "one\n"  # type: ignore[union-attr]


def test_streamed_message_matches(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    env.llm.script(*two_rounds())
    plain = claude.messages.create(**ask())
    env.llm.script(*two_rounds())
    with claude.messages.stream(**ask()) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    env.llm.done()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and "text" in kinds

    def blank(m: Any) -> Any:
        """The message without what differs between two runs (ids, the container)."""
        blocks = []
        for b in m.content:
            data = b.model_dump(exclude_none=True)
            for key in ("id", "tool_use_id"):
                data.pop(key, None)
            for f in data.get("content", {}).get("files", []):
                f.update(container_id="*", file_id="*")
            blocks.append(data)
        return blocks, m.stop_reason, m.usage.model_dump(), m.container is not None

    assert blank(final) == blank(plain)
    assert final.stop_reason == "end_turn"


def test_streamed_text_arrives_while_the_model_writes(
    env: LLMEnv, claude: anthropic.Anthropic
) -> None:
    """The upstream holds its last chunk back until the first text delta reaches us."""
    text = "Anthropic-shaped text, in four pieces."
    hold = threading.Event()
    reply = Reply(text=text, pieces=4, hold=hold)
    env.llm.script(reply)
    deltas = []
    with claude.messages.stream(
        model=MODELS["chat"], max_tokens=100, messages=[{"role": "user", "content": "talk"}]
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                if not hold.is_set():
                    assert not reply.finished.is_set(), "the text came after the last chunk"
                    hold.set()
                deltas.append(event.delta.text)
        final = stream.get_final_message()
    [seen] = env.llm.done()
    assert seen.body["stream"] is True
    assert len(deltas) == 4 and "".join(deltas) == text
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"


def test_custom_tools_come_back_as_tool_use(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    lookup = {
        "name": "lookup",
        "description": "Look a word up",
        "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
    }
    env.llm.script(Reply(calls=[Call("lookup", {"word": "shell"}, "call_lk")]))
    m = claude.messages.create(
        model=MODELS["chat"],
        max_tokens=100,
        messages=[{"role": "user", "content": "define shell"}],
        tools=[SHELL_TOOL, lookup],  # type: ignore[list-item]
    )
    assert m.stop_reason == "tool_use"
    [use] = m.content
    assert (use.type, use.id, use.name, use.input) == (
        "tool_use",
        "call_lk",
        "lookup",
        {"word": "shell"},
    )  # type: ignore[union-attr]

    def check(seen: Seen) -> Reply:
        assert seen.outputs() == [{"call_id": "call_lk", "result": "a program that runs commands"}]
        return say("A shell runs commands.")

    env.llm.script(check)
    m2 = claude.messages.create(
        model=MODELS["chat"],
        max_tokens=100,
        messages=[
            {"role": "user", "content": "define shell"},
            {"role": "assistant", "content": [use.model_dump()]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_lk",
                        "content": "a program that runs commands",
                    }
                ],
            },
        ],
        tools=[SHELL_TOOL, lookup],  # type: ignore[list-item]
    )
    assert m2.content[0].text == "A shell runs commands."  # type: ignore[union-attr]
    env.llm.done()


def test_x_api_key_and_error_envelope(env: LLMEnv) -> None:
    env.llm.script(say("hi"))
    with httpx.Client(base_url=env.server.root_url, timeout=30) as http:
        ok = http.post(
            "/v1/messages",
            headers={"x-api-key": env.api_key, "anthropic-version": "2023-06-01"},
            json={
                "model": MODELS["chat"],
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["content"] == [{"type": "text", "text": "hi", "citations": None}]
        assert ok.json()["container"] is None
        bad = http.post(
            "/v1/messages",
            headers={"x-api-key": env.api_key},
            json={
                "model": MODELS["chat"],
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
        )
        assert bad.status_code == 400
        body = bad.json()
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert "web_search_20250305" in body["error"]["message"]
        denied = http.post("/v1/messages", headers={"x-api-key": "nope"}, json={})
        assert denied.status_code == 401
    env.llm.done()


def test_badly_typed_fields_are_400s_in_anthropic_envelope(env: LLMEnv) -> None:
    env.llm.script()
    base = {
        "model": MODELS["chat"],
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx.Client(base_url=env.server.root_url, timeout=30) as http:
        for field, value in (("temperature", "hot"), ("stream", "yes"), ("max_tokens", "ten")):
            r = http.post(
                "/v1/messages", headers={"x-api-key": env.api_key}, json={**base, field: value}
            )
            assert r.status_code == 400, (field, r.text)
            body = r.json()
            assert body["type"] == "error" and body["error"]["param"] == field, body
            assert field in body["error"]["message"], body
    assert env.llm.done() == []


def test_upstream_failure_is_a_502(env: LLMEnv, claude: anthropic.Anthropic) -> None:
    env.llm.script(Reply(status=503, raw={"error": {"message": "down for maintenance"}}))
    with pytest.raises(anthropic.APIStatusError) as info:
        claude.messages.create(
            model=MODELS["chat"], max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 502
    assert "down for maintenance" in str(info.value)
    env.llm.done()
