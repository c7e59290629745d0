"""POST /v1/containers/{id}/calls: shell_call and local_shell_call, plain and streamed."""

from __future__ import annotations

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
from api_helpers import WAIT_S, error_of, host_pids, local_shell, shell, wait_until


def test_shell_call_output_item(http: httpx.Client, cid: str) -> None:
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={
            "type": "shell_call",
            "id": "sh_1",
            "call_id": "call_abc",
            "status": "completed",
            "action": {
                "commands": ["echo out; echo err >&2", "exit 3", "pwd; id -u", "sleep 5"],
                "timeout_ms": 1000,
                "max_output_length": 1000,
            },
        },
    )
    assert r.status_code == 200, r.text
    item = r.json()
    assert item["type"] == "shell_call_output"
    assert item["id"].startswith("sho_")
    assert item["call_id"] == "call_abc"
    assert item["status"] == "completed"
    assert item["max_output_length"] == 1000
    assert item["output"] == [
        {"stdout": "out\n", "stderr": "err\n", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "", "stderr": "", "outcome": {"type": "exit", "exit_code": 3}},
        {"stdout": "/mnt/data\n1000\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
        {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
    ]
    assert item["files"] == []


def test_shell_call_clamps_and_defaults(http: httpx.Client, cid: str) -> None:
    item = shell(http, cid, "head -c 100000 /dev/zero | tr '\\0' x", max_output_length=10**9)
    assert item["max_output_length"] == 65_536
    assert len(item["output"][0]["stdout"]) <= 65_536
    item = shell(http, cid, "echo", timeout_ms=None, max_output_length=None)
    assert item["max_output_length"] == 16_384


def test_citations_newest_first_at_most_ten_downloadable(
    client: Any, http: httpx.Client, cid: str
) -> None:
    shell(http, cid, "echo old > old.txt")
    item = shell(
        http,
        cid,
        "for i in $(seq 1 12); do echo $i > f$i.txt; sleep 0.02; done; echo x >> old.txt",
    )
    names = [f["filename"] for f in item["files"]]
    assert names == ["old.txt"] + [f"f{i}.txt" for i in range(12, 3, -1)]
    for cite in item["files"]:
        assert cite["type"] == "container_file_citation"
        assert cite["container_id"] == cid
        assert (cite["start_index"], cite["end_index"]) == (0, 0)
        body = client.containers.files.content.retrieve(cite["file_id"], container_id=cid).read()
        expected = b"old\nx\n" if cite["filename"] == "old.txt" else cite["filename"][1:-4].encode()
        assert body.strip() == expected.strip()
    # A call that changes nothing cites nothing; one in a subdirectory cites the file by name.
    assert shell(http, cid, "cat f1.txt")["files"] == []
    item = shell(http, cid, "mkdir -p sub && echo s > sub/deep.txt")
    assert [f["filename"] for f in item["files"]] == ["deep.txt"]
    listed = {f.id: f.path for f in client.containers.files.list(cid)}
    assert listed[item["files"][0]["file_id"]] == "/mnt/data/sub/deep.txt"


def test_citation_of_file_with_preserved_old_mtime(http: httpx.Client, cid: str) -> None:
    """``touch -d``, ``cp -p`` and ``tar x`` keep old times; the file is still new to the call."""
    item = shell(http, cid, "echo a > a.txt && touch -d '2001-01-01' a.txt")
    assert [f["filename"] for f in item["files"]] == ["a.txt"]


def files_of(client: openai.OpenAI, cid: str) -> set[str]:
    return {f.path for f in client.containers.files.list(cid)}


def test_a_call_cites_only_what_changed_during_it(
    client: openai.OpenAI, http: httpx.Client, cid: str
) -> None:
    """File times cannot say what a call changed: a file written by the previous call may
    carry a time later than this call's start (fine-grained kernel stamps, or ``touch -d``
    into the future), and one a concurrent listing indexed mid-call is still this call's."""
    shell(http, cid, "echo f > future.txt && touch -d '+1 hour' future.txt")
    assert shell(http, cid, "true")["files"] == []
    for _ in range(20):  # back to back, as a tool loop issues them
        assert shell(http, cid, "seq 3 > n.txt")["files"] != []
        assert shell(http, cid, "cat n.txt")["files"] == []
    with ThreadPoolExecutor(1) as pool:
        # It runs until the test lets it end (/tmp is not the workspace a call cites), not
        # for a fixed time that a loaded host could use up before the listing.
        wait = "until [ -e /tmp/go ]; do sleep 0.05; done"
        slow = pool.submit(shell, http, cid, f"echo slow > slow.txt; {wait}")
        listed = wait_until(lambda: "/mnt/data/slow.txt" in files_of(client, cid), WAIT_S, 0.05)
        assert listed and not slow.done()
        shell(http, cid, "touch /tmp/go")
        item = slow.result()
    assert [f["filename"] for f in item["files"]] == ["slow.txt"]


def test_an_item_is_checked_against_its_model(http: httpx.Client, cid: str) -> None:
    url = f"/v1/containers/{cid}/calls"
    local = "local_shell_call"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"type": local, "action": {"command": ["id"], "user": ["root"]}}, "action.user"),
        ({"type": local, "action": {"command": ["id"], "timeout_ms": True}}, "action.timeout_ms"),
        ({"type": "apply_patch_call", "operation": {"type": "create_file"}}, "operation.path"),
    ]
    for body, param in bad:
        r = http.post(url, json=body)
        assert r.status_code == 400, (body, r.text)
        assert error_of(r)["param"] == param, (body, r.text)
    ok = {"type": "local_shell_call", "action": {"command": ["id", "-u"], "user": 1000}}
    r = http.post(url, json=ok)
    assert r.status_code == 200 and r.json()["output"].strip() == "1000", r.text


def test_commands_count_and_validation(http: httpx.Client, cid: str) -> None:
    url = f"/v1/containers/{cid}/calls"
    for commands in ([], ["true"] * 101):
        r = http.post(
            url, json={"type": "shell_call", "call_id": "c", "action": {"commands": commands}}
        )
        assert r.status_code == 400, r.text
        err = error_of(r)
        assert err["param"] == "action.commands"
        assert "at least one" in err["message"] or "at most 100" in err["message"]
    r = http.post(
        url, json={"type": "shell_call", "call_id": "c", "action": {"commands": ["true"] * 100}}
    )
    assert r.status_code == 200 and len(r.json()["output"]) == 100
    bad: list[tuple[dict[str, Any], str]] = [
        ({"type": "shell_call", "call_id": "c"}, "action"),
        ({"type": "shell_call", "action": {"commands": "ls"}}, "action.commands"),
        ({"type": "shell_call", "action": {"commands": [1]}}, "action.commands"),
        (
            {"type": "shell_call", "action": {"commands": ["ls"], "timeout_ms": "5"}},
            "action.timeout_ms",
        ),
        (
            {"type": "shell_call", "action": {"commands": ["ls"], "max_output_length": 1.5}},
            "action.max_output_length",
        ),
        ({"type": "shell_call", "call_id": 5, "action": {"commands": ["ls"]}}, "call_id"),
        ({"type": "nonsense"}, "type"),
        ({"action": {"commands": ["ls"]}}, "type"),
        ({"type": "local_shell_call", "action": {"command": "ls"}}, "action.command"),
        (
            {"type": "local_shell_call", "action": {"command": ["ls"], "env": {"A": 1}}},
            "action.env",
        ),
        (
            {"type": "local_shell_call", "action": {"command": ["ls"], "timeout_ms": "x"}},
            "action.timeout_ms",
        ),
        (
            {"type": "local_shell_call", "action": {"command": ["ls"], "working_directory": 3}},
            "action.working_directory",
        ),
    ]
    for body, param in bad:
        r = http.post(url, json=body)
        assert r.status_code == 400, (body, r.text)
        assert error_of(r)["param"] == param, (body, r.text)
    for raw in (b"[1, 2]", b'"shell_call"', b"{not json"):
        r = http.post(url, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)


def test_one_mebibyte_command(http: httpx.Client, cid: str) -> None:
    payload = "x" * (1024 * 1024 - 64)
    item = shell(http, cid, f"s='{payload}'; echo ${{#s}}")
    assert item["output"][0]["stdout"] == f"{len(payload)}\n"


def test_local_shell_call_texts(http: httpx.Client, cid: str) -> None:
    item = local_shell(http, cid, ["bash", "-c", "echo hi; echo warn >&2"])
    assert item["type"] == "local_shell_call_output"
    assert item["call_id"] == "call_l" and item["id"] == "call_l"
    assert item["output"] == "hi\nwarn\n"
    assert local_shell(http, cid, ["bash", "-c", "echo no; exit 7"])["output"] == (
        "no\nCommand failed with exit code 7.\n"
    )
    item = local_shell(http, cid, ["bash", "-c", "echo started; sleep 10"], timeout_ms=500)
    assert item["output"] == "started\nCommand timed out.\n"
    assert local_shell(http, cid, ["id", "-u"], user="root")["output"] == (
        "Unsupported execution user: root.\n"
    )
    assert local_shell(http, cid, ["id", "-u"], user="user")["output"] == "1000\n"
    assert local_shell(http, cid, [])["output"] == "Command is empty.\n"
    item = local_shell(
        http,
        cid,
        ["sh", "-c", 'echo "$GREETING from $(pwd)"'],
        env={"GREETING": "hello"},
        working_directory="/tmp",
    )
    assert item["output"] == "hello from /tmp\n"
    # argv is passed as-is: no shell interprets it.
    assert local_shell(http, cid, ["echo", "$HOME", "a;b", "'q'"])["output"] == "$HOME a;b 'q'\n"
    item = local_shell(http, cid, ["no-such-program"])
    assert item["output"].endswith("Command failed with exit code 127.\n")


def _sse(lines: list[str]) -> list[dict[str, Any]]:
    events = []
    for line in lines:
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


def test_streamed_deltas_arrive_before_the_command_ends(http: httpx.Client, cid: str) -> None:
    body = {
        "type": "shell_call",
        "call_id": "call_s",
        "action": {"commands": ["echo a; sleep 2; echo b; echo e >&2", "echo second"]},
    }
    started = time.monotonic()
    arrivals: list[tuple[float, dict[str, Any]]] = []
    with http.stream("POST", f"/v1/containers/{cid}/calls?stream=true", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        kinds_seen = []
        for line in r.iter_lines():
            if line.startswith("event: "):
                kinds_seen.append(line[7:])
            elif line.startswith("data: "):
                arrivals.append((time.monotonic() - started, json.loads(line[6:])))
    events = [e for _, e in arrivals]
    assert kinds_seen == [e["type"] for e in events]
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    first_a = next(
        t for t, e in arrivals if e["type"].endswith("delta") and e["delta"].get("stdout") == "a\n"
    )
    end = arrivals[-1][0]
    # "a" came out while the command still had its 2 s sleep ahead of it.
    assert end - first_a >= 1.5 and end >= 2.0, (first_a, end)

    deltas = [e for e in events if e["type"] == "response.shell_call_output_content.delta"]
    text0 = "".join(e["delta"].get("stdout", "") for e in deltas if e["command_index"] == 0)
    assert text0 == "a\nb\n"
    assert "".join(e["delta"].get("stderr", "") for e in deltas) == "e\n"
    dones = [e for e in events if e["type"] == "response.shell_call_output_content.done"]
    assert [d["command_index"] for d in dones] == [0, 1]
    assert dones[1]["output"][0]["stdout"] == "second\n"
    assert events[0]["type"] == "response.output_item.added"
    final = events[-1]
    assert final["type"] == "response.output_item.done"
    item = final["item"]
    assert item["type"] == "shell_call_output" and item["call_id"] == "call_s"
    assert item["status"] == "completed"
    assert [o["stdout"] for o in item["output"]] == ["a\nb\n", "second\n"]
    item_ids = {e.get("item_id") for e in deltas + dones}
    assert item_ids == {item["id"]}


def test_stream_errors(http: httpx.Client, cid: str) -> None:
    r = http.post(
        f"/v1/containers/{cid}/calls?stream=true",
        json={"type": "shell_call", "call_id": "c", "action": {"commands": []}},
    )
    assert r.status_code == 400 and error_of(r)["param"] == "action.commands"
    r = http.post(
        "/v1/containers/cntr_missing/calls?stream=true",
        json={"type": "shell_call", "call_id": "c", "action": {"commands": ["true"]}},
    )
    assert r.status_code == 404


def test_client_disconnect_kills_the_command(http: httpx.Client, cid: str) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    body = {
        "type": "shell_call",
        "call_id": "c",
        "action": {"commands": [f"echo go; exec -a {marker} sleep 1000"], "timeout_ms": 120_000},
    }
    with http.stream("POST", f"/v1/containers/{cid}/calls?stream=true", json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if '"go\\n"' in line:
                break
        assert wait_until(lambda: bool(host_pids(marker)), WAIT_S)
        lines.close()  # leaving the loop early closes the response: the client is gone
    # The response is closed: the command must die long before its 120 s timeout.
    assert wait_until(lambda: not host_pids(marker), WAIT_S), host_pids(marker)
    # The container still works afterwards.
    assert shell(http, cid, "echo fine")["output"][0]["stdout"] == "fine\n"


def test_background_process_keeps_running_and_call_returns(http: httpx.Client, cid: str) -> None:
    marker = f"svc-{secrets.token_hex(6)}"
    started = time.monotonic()
    shell(http, cid, f"(exec -a {marker} sleep 1000) & echo started")
    assert time.monotonic() - started < 5
    item = shell(
        http,
        cid,
        f"cat /proc/[0-9]*/cmdline | tr '\\0' '\\n' | grep -c '^{marker}'",
    )
    assert item["output"][0]["stdout"].strip() == "1"
