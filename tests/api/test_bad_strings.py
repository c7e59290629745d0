"""Strings no command, path or database can hold (lone surrogates, NUL bytes) are a 400 that
names the field, answered before anything runs; every 400 names its field."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from api_helpers import error_of, local_shell, shell
from test_responses_upstream import MODELS, LLMEnv, llm_env

SURROGATE = "\ud800"
JSON = {"content-type": "application/json"}
MULTIPART = "multipart/form-data; boundary=zz"


def raw_json(value: Any) -> bytes:
    """JSON as a client may send it: ``ensure_ascii`` spells a lone surrogate as ``\\ud800``."""
    return json.dumps(value, ensure_ascii=True).encode()


def post_raw(http: httpx.Client, url: str, body: Any) -> httpx.Response:
    return http.post(url, content=raw_json(body), headers={"content-type": "application/json"})


def call_cases(bad: str) -> list[tuple[dict[str, Any], str]]:
    touch = "touch /mnt/data/ran"
    return [
        ({"type": "shell_call", "action": {"commands": [f"echo {bad}"]}}, "action.commands[0]"),
        (
            {"type": "shell_call", "call_id": f"c{bad}", "action": {"commands": [touch]}},
            "call_id",
        ),
        (
            {"type": "shell_call", "call_id": "c", "action": {"commands": [touch, bad]}},
            "action.commands[1]",
        ),
        (
            {"type": "local_shell_call", "action": {"type": "exec", "command": ["touch", bad]}},
            "action.command[1]",
        ),
        (
            {
                "type": "local_shell_call",
                "call_id": "c",
                "action": {"type": "exec", "command": ["touch", "ran"], "env": {"A": bad}},
            },
            "action.env.A",
        ),
        (
            {
                "type": "local_shell_call",
                "call_id": bad,
                "action": {"type": "exec", "command": ["touch", "/mnt/data/ran"]},
            },
            "call_id",
        ),
        (
            {
                "type": "local_shell_call",
                "action": {"type": "exec", "command": ["touch", "ran"], "working_directory": bad},
            },
            "action.working_directory",
        ),
        (
            {
                "type": "apply_patch_call",
                "call_id": "c",
                "operation": {"type": "create_file", "path": f"a{bad}.txt", "diff": "+x\n"},
            },
            "operation.path",
        ),
        (
            {
                "type": "apply_patch_call",
                "call_id": "c",
                "operation": {"type": "create_file", "path": "ran", "diff": f"+x{bad}\n"},
            },
            "operation.diff",
        ),
    ]


@pytest.mark.parametrize("bad", [SURROGATE, "\udfff", "\x00"], ids=["high", "low", "nul"])
def test_bad_strings_in_calls_are_400_and_run_nothing(
    http: httpx.Client, cid: str, bad: str
) -> None:
    for item, param in call_cases(bad):
        for url in (f"/v1/containers/{cid}/calls", f"/v1/containers/{cid}/calls?stream=true"):
            if "stream" in url and item["type"] != "shell_call":
                continue
            r = post_raw(http, url, item)
            assert r.status_code == 400, (item, url, r.text)
            err = error_of(r)
            assert err["param"] == param, (item, err)
            assert param in err["message"], err
    # Nothing ran: not the command before the bad one, nor the one with a bad call_id.
    assert shell(http, cid, "ls /mnt/data/ran")["output"][0]["outcome"]["exit_code"] != 0


def test_bad_strings_in_other_bodies_params_and_uploads(http: httpx.Client, cid: str) -> None:
    for bad in (SURROGATE, "\x00"):
        for body, param in (
            ({"name": f"n{bad}"}, "name"),
            ({"name": "n", "file_ids": ["file-1", bad]}, "file_ids[1]"),
            ({"name": "n", "network_policy": {"type": "allowlist", "allowed_domains": [bad]}},
             "network_policy.allowed_domains[0]"),
        ):  # fmt: skip
            r = post_raw(http, "/v1/containers", body)
            assert r.status_code == 400 and error_of(r)["param"] == param, (body, r.text)
        r = post_raw(http, f"/v1/containers/{cid}/files", {"file_id": f"file-{bad}"})
        assert r.status_code == 400 and error_of(r)["param"] == "file_id", r.text
    r = http.get("/v1/containers", params={"name": "a\x00b"})
    assert r.status_code == 400 and error_of(r)["param"] == "name", r.text
    for url in (
        "/v1/containers/cntr_%00",
        f"/v1/containers/{cid}/files/cfile_%00",
        "/v1/files/file-%00/content",
    ):
        r = http.get(url)
        assert r.status_code == 400, (url, r.text)
        assert error_of(r)["param"] in ("container_id", "file_id"), r.text
    r = http.get(f"/v1/containers/{cid}/workspace/file", params={"path": "a\x00"})
    assert r.status_code == 400 and error_of(r)["param"] == "path", r.text
    # A multipart upload whose file name (the path in /mnt/data) holds a NUL byte, raw (httpx
    # would escape it as %00).
    multipart = (
        b'--b\r\ncontent-disposition: form-data; name="file"; filename="a\x00b.txt"\r\n\r\n'
        b"x\r\n--b--\r\n"
    )
    r = http.post(
        f"/v1/containers/{cid}/files",
        content=multipart,
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert r.status_code == 400 and error_of(r)["param"] == "file", r.text
    r = http.post("/v1/files", files={"file": ("f.txt", b"x")}, data={"purpose": "user\x00"})
    assert r.status_code == 400 and error_of(r)["param"] == "purpose", r.text


def test_env_names_must_be_names(http: httpx.Client, cid: str) -> None:
    for name in ("A=B", ""):
        r = http.post(
            f"/v1/containers/{cid}/calls",
            json={
                "type": "local_shell_call",
                "call_id": "c",
                "action": {"type": "exec", "command": ["env"], "env": {name: "1"}},
            },
        )
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["param"] == f"action.env.{name}" and "'='" in err["message"], err


def test_missing_working_directory_is_an_error_in_the_output(http: httpx.Client, cid: str) -> None:
    out = local_shell(http, cid, ["pwd"], working_directory="/nonexistent")
    assert "/nonexistent" in out["output"] and "No such file or directory" in out["output"]
    assert "Command failed with exit code 1." in out["output"], out
    shell(http, cid, "mkdir -p sub")
    assert local_shell(http, cid, ["pwd"], working_directory="sub")["output"] == "/mnt/data/sub\n"
    assert local_shell(http, cid, ["pwd"], working_directory="/tmp")["output"] == "/tmp\n"


def test_every_400_names_its_field(http: httpx.Client, cid: str) -> None:
    calls = f"/v1/containers/{cid}/calls"
    item = b'{"type":"shell_call","action":{"commands":["ls"]}}'
    bad_utf8 = b'{"type": "shell_call", "x": "\xff"}'
    garbled = {"content": b"x", "headers": {"content-type": MULTIPART}}
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", calls, {"content": b"[]", "headers": JSON}, "body"),
        ("POST", calls, {"content": b"{", "headers": JSON}, "body"),
        ("POST", calls, {"content": bad_utf8, "headers": JSON}, "body"),
        ("POST", calls, {"content": b"[" * 100_000 + b"]" * 100_000, "headers": JSON}, "body"),
        ("POST", calls, {"content": item, "headers": {"content-type": "text/plain"}}, "body"),
        ("POST", "/v1/responses", {"content": b"5", "headers": JSON}, "body"),
        ("POST", "/v1/files", garbled, "file"),
        ("POST", f"/v1/containers/{cid}/files", garbled, "file"),
        ("GET", f"/v1/containers/{cid}/workspace/file", {}, "path"),
    ]  # fmt: skip
    for call_id in ("5", "{}", "[]"):
        body = b'{"type":"%s","call_id":%s,"action":{"commands":["touch ran"]}}'
        for kind, url in (("shell_call", calls), ("shell_call", calls + "?stream=true")):
            raw = body % (kind.encode(), call_id.encode())
            cases.append(("POST", url, {"content": raw, "headers": JSON}, "call_id"))
        patch = b'{"type":"apply_patch_call","call_id":%s,"operation":{"type":"create_file",'
        patch += b'"path":"ran","diff":"+x"}}'
        cases.append(
            ("POST", calls, {"content": patch % call_id.encode(), "headers": JSON}, "call_id")
        )
    for method, url, kw, param in cases:
        r = http.request(method, url, **kw)
        assert r.status_code == 400, (url, kw, r.text)
        err = error_of(r)
        assert err["param"] == param, (url, kw, err)
        assert "Error:" not in err["message"] and "Traceback" not in err["message"], err
    assert shell(http, cid, "ls /mnt/data/ran")["output"][0]["outcome"]["exit_code"] != 0


@pytest.fixture(scope="module")
def llm(server_factory: Callable[..., Any]) -> Iterator[LLMEnv]:
    yield from llm_env(server_factory)


def test_numbers_json_cannot_hold_are_400(llm: LLMEnv) -> None:
    # Python's json reads NaN, Infinity and 1e400 (inf); a response object echoes temperature.
    llm.llm.script()
    model = MODELS["chat"]
    with llm.http() as http:
        for number in ("NaN", "Infinity", "-Infinity", "1e400"):
            raw = f'{{"model": "{model}", "input": "x", "temperature": {number}}}'
            r = http.post("/v1/responses", content=raw.encode(), headers=JSON)
            assert r.status_code == 400, (number, r.text)
            assert error_of(r)["param"] == "temperature"
        raw = '{"name": "n", "metadata": {"a": [1, NaN]}}'
        r = http.post("/v1/containers", content=raw.encode(), headers=JSON)
        assert r.status_code == 400 and error_of(r)["param"] == "metadata.a[1]", r.text
    assert llm.llm.done() == []
