"""shellbox.client against the real server: calls (plain and streamed), workspace, errors."""

from __future__ import annotations

import io
import re
import socket
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shellbox.client import (
    APIConnectionError,
    APITimeoutError,
    AsyncShellbox,
    AuthenticationError,
    BadRequestError,
    CallDone,
    CommandDone,
    NotFoundError,
    OutputDelta,
    Shellbox,
)

# Prints, then waits until the test answers: it can only finish if the test saw the first
# line while the command was still running.
HANDSHAKE = "echo first; for i in $(seq 200); do [ -e go ] && break; sleep 0.05; done; echo second"


@pytest.fixture
def cid(sb_sync: Shellbox) -> Iterator[str]:
    c = sb_sync.openai.containers.create(name="client")  # the openai SDK, reused
    yield c.id
    sb_sync.openai.containers.delete(c.id)


def test_shell_local_shell_and_raw_calls(sb_sync: Shellbox, cid: str) -> None:
    out = sb_sync.calls.shell(
        cid, ["echo hi > hi.txt && cat hi.txt", "exit 7"], max_output_length=100, call_id="c1"
    )
    assert out.call_id == "c1"
    assert out.max_output_length == 100
    assert [(o.stdout, o.exit_code) for o in out.output] == [("hi\n", 0), ("", 7)]
    assert [f.filename for f in out.files] == ["hi.txt"]
    local = sb_sync.calls.local_shell(cid, ["cat", "hi.txt"], call_id="c2")
    assert (local.call_id, local.output) == ("c2", "hi\n")
    raw = sb_sync.calls.create(
        cid, {"type": "shell_call", "call_id": "c3", "action": {"commands": ["pwd"]}}
    )
    assert raw["output"][0]["stdout"] == "/mnt/data\n"


def test_streamed_call_yields_deltas_before_the_command_ends(sb_sync: Shellbox, cid: str) -> None:
    seen: list[Any] = []
    with sb_sync.calls.stream_shell(cid, [HANDSHAKE], timeout_ms=20_000) as stream:
        for event in stream:
            seen.append(event)
            if isinstance(event, OutputDelta) and "first" in event.text:
                sb_sync.workspace.write(cid, "go", b"")  # only now may the command finish
        final = stream.output
    assert final is not None
    assert final.output[0].stdout == "first\nsecond\n"
    assert final.output[0].outcome.type == "exit"
    kinds = [type(e) for e in seen]
    assert kinds.index(OutputDelta) < kinds.index(CommandDone) < kinds.index(CallDone)
    assert kinds[-1] is CallDone


async def test_async_streamed_call_yields_deltas_before_the_command_ends(
    sb: AsyncShellbox,
) -> None:
    c = await sb.openai.containers.create(name="client-async")
    try:
        first_at = done_at = 0.0
        async with sb.calls.stream_shell(c.id, [HANDSHAKE], timeout_ms=20_000) as stream:
            async for event in stream:
                if isinstance(event, OutputDelta) and "first" in event.text and not first_at:
                    first_at = time.monotonic()
                    await sb.workspace.write(c.id, "go", b"")
                if isinstance(event, CallDone):
                    done_at = time.monotonic()
            final = await stream.until_done()
        assert final.output[0].stdout == "first\nsecond\n"
        assert 0 < first_at < done_at
    finally:
        await sb.openai.containers.delete(c.id)


def test_workspace_files_and_archives(sb_sync: Shellbox, cid: str) -> None:
    stored = sb_sync.workspace.write(cid, "dir/data.bin", b"\x00\x01\x02")
    assert (stored.path, stored.bytes) == ("/mnt/data/dir/data.bin", 3)
    assert sb_sync.workspace.read(cid, "dir/data.bin") == b"\x00\x01\x02"
    assert sb_sync.workspace.read(cid, "/mnt/data/dir/data.bin", max_bytes=2) == b"\x00\x01"
    archive = sb_sync.workspace.export_archive(cid, path="dir")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        assert [m.name for m in tf.getmembers() if m.isfile()] == ["./data.bin"]
    sb_sync.workspace.import_archive(cid, archive, path="copy")
    assert sb_sync.workspace.read(cid, "copy/data.bin") == b"\x00\x01\x02"


def test_api_errors_map_to_specific_exceptions(sb_sync: Shellbox, cid: str) -> None:
    with pytest.raises(NotFoundError) as not_found:
        sb_sync.calls.shell("cntr_doesnotexist", ["true"])
    err = not_found.value
    assert (err.status_code, err.code, err.param) == (404, "container_not_found", "container_id")
    assert "cntr_doesnotexist" in err.message
    assert err.request_id and err.request_id.startswith("req_")

    with pytest.raises(BadRequestError) as bad:
        sb_sync.calls.shell(cid, [])
    assert (bad.value.status_code, bad.value.param) == (400, "action.commands")
    assert bad.value.type == "invalid_request_error"

    with pytest.raises(NotFoundError) as missing:
        sb_sync.workspace.read(cid, "no/such/file")
    assert missing.value.code == "file_not_found"

    with pytest.raises(BadRequestError):
        sb_sync.workspace.read(cid, "../etc/passwd")


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_key_refused_connection_and_timeout(server: Any, api_key: str, cid: str) -> None:
    with Shellbox(server.base_url, "sk-wrong") as wrong, pytest.raises(AuthenticationError) as auth:
        wrong.calls.shell(cid, ["true"])
    assert auth.value.status_code == 401
    assert auth.value.type == "authentication_error"

    nowhere = f"http://127.0.0.1:{unused_port()}/v1"
    with Shellbox(nowhere, api_key) as down, pytest.raises(APIConnectionError) as refused:
        down.calls.shell(cid, ["true"])
    assert not isinstance(refused.value, APITimeoutError)
    assert "127.0.0.1" in refused.value.message

    with Shellbox(server.base_url, api_key, timeout=0.5) as hasty:
        started = time.monotonic()
        with pytest.raises(APITimeoutError):
            hasty.calls.shell(cid, ["sleep 3"])
        assert time.monotonic() - started < 2.5


async def test_async_errors(server: Any, sb: AsyncShellbox, api_key: str) -> None:
    with pytest.raises(NotFoundError) as not_found:
        await sb.calls.shell("cntr_doesnotexist", ["true"])
    assert not_found.value.code == "container_not_found"
    async with AsyncShellbox(f"http://127.0.0.1:{unused_port()}/v1", api_key) as down:
        with pytest.raises(APIConnectionError):
            await down.workspace.read("cntr_x", "a")


def test_pty_sync_terminal_runs_to_its_exit_code(sb_sync: Shellbox, cid: str) -> None:
    with sb_sync.pty(cid, cols=50, rows=10) as term:
        term.send("stty size; tty; exit 6\n")
        out = b"".join(term)
    assert re.search(rb"[\r\n]10 50\r\n/dev/pts/\d+\r\n", out), out
    assert term.exit_code == 6
    with pytest.raises(NotFoundError) as caught, sb_sync.pty("cntr_missing"):
        pass
    assert caught.value.code == "container_not_found"


async def test_pty_async_terminal_resizes_and_runs_a_command(sb: AsyncShellbox) -> None:
    box = await sb.openai.containers.create(name="client-pty")
    try:
        async with sb.pty(box.id, command="read line; stty size; echo got $line") as term:
            await term.resize(77, 33)
            await term.send(b"abc\n")
            out = b"".join([chunk async for chunk in term])
        assert b"33 77\r\ngot abc\r\n" in out, out
        assert term.exit_code == 0
    finally:
        await sb.openai.containers.delete(box.id)
