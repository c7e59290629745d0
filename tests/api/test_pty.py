"""Terminals over a real WebSocket client (``websockets``), against a real server and real
containers: a real pseudo-terminal with job control, resize, exit codes, back-pressure with a
slow reader, tenancy and authentication, and the container's sleep, pause and delete."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from api_helpers import WAIT_S, host_pids, shell, wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

# Activity is kept in whole seconds: something used 0.9 s ago may already count as 1 s
# idle. Terminals in use must stay awake through that, so these tests idle 2 s.
SHORT_IDLE = {
    "SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "2",
    "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
}


def pty_url(server: Any, cid: str, **params: Any) -> str:
    query = f"?{urlencode(params)}" if params else ""
    return f"ws://127.0.0.1:{server.port}/v1/containers/{cid}/pty{query}"


class Term:
    """A terminal's WebSocket with a buffer of what it printed."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.seen = b""
        self.control: list[dict[str, Any]] = []

    def send(self, data: bytes) -> None:
        self.ws.send(data)

    def resize(self, cols: int, rows: int) -> None:
        self.ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def until(self, pattern: bytes, timeout_s: float = WAIT_S) -> bytes:
        """Read until ``pattern`` shows; returns (and forgets) everything read so far."""
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, self.seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-2000:]!r}"
            try:
                message = self.ws.recv(timeout=left)
            except TimeoutError:
                raise AssertionError(f"no {pattern!r} in {self.seen[-2000:]!r}") from None
            if isinstance(message, str):
                self.control.append(json.loads(message))
            else:
                self.seen += message
        found, self.seen = self.seen, b""
        return found

    def until_closed(self, timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                message = self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
                if isinstance(message, str):
                    self.control.append(json.loads(message))
                else:
                    self.seen += message
        except ConnectionClosed:
            return


def open_term(server: Any, key: str, cid: str, **params: Any) -> ClientConnection:
    return connect(
        pty_url(server, cid, **params),
        additional_headers={"authorization": f"Bearer {key}"},
        open_timeout=60,
        max_size=None,
        ping_interval=None,  # a slow reader's pong waits behind the output it has not read
    )


@pytest.fixture
def term_of(server: Any, api_key: str) -> Iterator[Callable[..., Term]]:
    opened: list[ClientConnection] = []

    def make(cid: str, **params: Any) -> Term:
        ws = open_term(server, api_key, cid, **params)
        opened.append(ws)
        return Term(ws)

    yield make
    for ws in opened:
        ws.close()


def test_a_real_terminal_of_the_requested_size_that_resizes(
    term_of: Callable[..., Term], cid: str
) -> None:
    t = term_of(cid, cols=93, rows=21)
    t.send(b"tty; stty size; id -u; pwd; stat -c %U $(tty); echo =one\n")
    out = t.until(rb"[\r\n]=one")
    # The sandbox user's own terminal device, in /mnt/data.
    assert re.search(rb"/dev/pts/\d+\r\n21 93\r\n1000\r\n/mnt/data\r\nuser\r\n", out), out
    # In a command cgroup, under the limits every command runs under.
    t.send(b"grep -c cmd- /proc/self/cgroup; echo =cg\n")
    assert re.search(rb"[\r\n][1-9]\d*\r\n=cg", t.until(rb"[\r\n]=cg")), t.seen
    t.resize(120, 40)
    t.send(b"stty size; echo =two\n")
    assert re.search(rb"[\r\n]40 120\r\n", t.until(rb"[\r\n]=two")), t.seen


def test_ctrl_c_interrupts_the_foreground_job_and_the_prompt_returns(
    term_of: Callable[..., Term], cid: str
) -> None:
    t = term_of(cid)
    sleep = f"sleep 100.{secrets.randbelow(10**9)}"
    t.send(f"{sleep}; echo =not-interrupted\n".encode())
    t.until(sleep.encode())
    assert wait_until(lambda: bool(host_pids(sleep)), WAIT_S)  # running in the foreground
    started = time.monotonic()
    t.send(b"\x03")
    t.send(b"echo =back $?\n")
    out = t.until(rb"[\r\n]=back \d+")
    assert time.monotonic() - started < 60  # interrupted: not after the sleep's 100 s
    assert not re.search(rb"[\r\n]=not-interrupted", out), out
    assert re.search(rb"[\r\n]=back 130", out), out  # the shell saw sleep die of SIGINT


def test_a_client_that_leaves_ends_everything_the_terminal_started(
    server: Any, api_key: str, cid: str
) -> None:
    marker = f"{7000 + secrets.randbelow(1000)}.{secrets.randbelow(10**9)}"
    t = Term(open_term(server, api_key, cid))
    t.send(f"(sleep {marker} &); sleep {marker}1 & echo =started\n".encode())
    t.until(rb"[\r\n]=started")
    assert wait_until(lambda: len(host_pids(marker)) == 2, WAIT_S)
    t.ws.close()
    assert wait_until(lambda: host_pids(marker) == [], WAIT_S), host_pids(marker)


def test_exit_sends_the_exit_code_then_closes(term_of: Callable[..., Term], cid: str) -> None:
    t = term_of(cid)
    t.send(b"exit 3\n")
    t.until_closed()
    assert t.control == [{"type": "exit", "exit_code": 3}]
    assert t.ws.close_code == 1000


def test_a_command_instead_of_the_shell(term_of: Callable[..., Term], cid: str) -> None:
    t = term_of(cid, command="python3 -q")
    t.until(rb">>> ")
    t.send(b"print(6 * 7)\n")
    assert b"42" in t.until(rb"42\r\n>>> ")
    t.send(b"raise SystemExit(5)\n")
    t.until_closed()
    assert t.control == [{"type": "exit", "exit_code": 5}]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_ten_megabytes_through_a_slow_reader_arrive_whole(
    server: Any, term_of: Callable[..., Term], cid: str
) -> None:
    t = term_of(cid)
    # 10 MB of numbered lines (each 16 bytes), written to the terminal in large blocks.
    t.send(b"seq -f '%015g' 1 655360 > /tmp/n; stty -echo -onlcr; echo =ready\n")
    t.until(rb"=ready")
    time.sleep(0.2)
    t.until(rb"\$ $")  # the next prompt
    t.send(b"cat /tmp/n; echo =end\n")
    before = _rss_kib(server.proc.pid)
    peak = before
    chunks: list[bytes] = []
    received = 0
    started = time.monotonic()
    while b"=end\n" not in b"".join(chunks[-2:]):
        assert time.monotonic() - started < 120
        message = t.ws.recv(timeout=30)
        assert isinstance(message, bytes)
        chunks.append(message)
        received += len(message)
        if received < 3_000_000:
            time.sleep(0.05)  # a slow reader for the first 3 MB: the server must hold back
            peak = max(peak, _rss_kib(server.proc.pid))
    data = b"".join(chunks)
    lines = data[: data.rindex(b"=end\n")].split(b"\n")
    numbers = [line for line in lines if re.fullmatch(rb"\d{15}", line)]
    assert len(numbers) == 655360
    assert [int(n) for n in numbers] == list(range(1, 655361))
    # The server held at most a few socket buffers of it, never the output.
    assert peak - before < 8 * 1024, (before, peak)


def test_another_projects_key_gets_404_and_no_key_401(
    server: Any, cid: str, term_of: Callable[..., Term]
) -> None:
    other = server.create_key("pty-other")
    with pytest.raises(InvalidStatus) as caught:
        open_term(server, other, cid)
    assert caught.value.response.status_code == 404
    body = json.loads(caught.value.response.body)
    assert body["error"]["code"] == "container_not_found", body
    with pytest.raises(InvalidStatus) as caught:
        connect(pty_url(server, cid), open_timeout=30)
    assert caught.value.response.status_code == 401
    body = json.loads(caught.value.response.body)
    assert "missing API key" in body["error"]["message"], body
    with pytest.raises(InvalidStatus) as caught:
        term_of(cid, cols=0)
    assert caught.value.response.status_code == 400
    assert json.loads(caught.value.response.body)["error"]["param"] == "cols"


def test_several_terminals_up_to_the_cap_and_delete_ends_them(
    server: Any, http: httpx.Client, term_of: Callable[..., Term], cid: str
) -> None:
    terms = [term_of(cid) for _ in range(8)]  # limits.max_ptys_per_container
    for i, t in enumerate(terms):
        t.send(f"echo =t{i}\n".encode())
        t.until(rf"[\r\n]=t{i}".encode())
    with pytest.raises(InvalidStatus) as caught:
        term_of(cid)
    assert caught.value.response.status_code == 429
    assert http.delete(f"/v1/containers/{cid}").status_code == 200
    for t in terms:
        t.until_closed()
        assert t.ws.close_code == 1001
        assert "deleted" in (t.ws.close_reason or "")


def test_a_terminal_in_use_keeps_the_container_awake_and_a_pause_ends_it(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory(env=SHORT_IDLE)
    auth = {"authorization": "Bearer k"}  # open mode: any key from loopback
    with httpx.Client(base_url=srv.root_url, timeout=60, headers=auth) as http:
        cid = http.post("/v1/containers", json={"name": "awake"}).json()["id"]
        ws = open_term(srv, "k", cid)
        t = Term(ws)
        started = time.monotonic()
        while time.monotonic() - started < 5:  # over two idle-sleep periods of typing
            t.send(b"echo =awake\n")
            t.until(rb"[\r\n]=awake")
            time.sleep(0.3)
        assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"
        assert http.post(f"/v1/containers/{cid}/pause").status_code == 200
        t.until_closed()
        assert ws.close_code == 1001
        # Closed, the terminal holds nothing: the container goes to sleep when idle.
        shell(http, cid, "true")
        assert wait_until(
            lambda: http.get(f"/v1/containers/{cid}").json()["status"] == "sleeping", 15
        )
        # A terminal wakes a sleeping container, as any call does.
        t = Term(open_term(srv, "k", cid))
        t.send(b"echo =woke\n")
        t.until(rb"[\r\n]=woke")
        assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"
        t.ws.close()


def test_a_forgotten_terminal_lets_its_container_sleep_one_in_use_does_not(
    server_factory: Callable[..., Any],
) -> None:
    """A terminal counts as activity while bytes cross it, either way: keystrokes with
    nothing printed, or output with nothing typed. One with neither for the idle period
    (left open in a browser tab) holds nothing: the container sleeps, the terminal closes."""
    srv = server_factory(env=SHORT_IDLE)
    auth = {"authorization": "Bearer k"}  # open mode: any key from loopback
    with httpx.Client(base_url=srv.root_url, timeout=60, headers=auth) as http:

        def status(cid: str) -> str:
            return str(http.get(f"/v1/containers/{cid}").json()["status"])

        forgotten, ticking, typing = (
            http.post("/v1/containers", json={"name": n}).json()["id"]
            for n in ("forgotten", "ticking", "typing")
        )
        ticks = Term(open_term(srv, "k", ticking, command="while :; do echo tick; sleep 0.3; done"))
        keys = Term(
            open_term(srv, "k", typing, command="stty -echo; echo =ready; exec cat >/dev/null")
        )
        keys.until(rb"=ready")
        idle = Term(open_term(srv, "k", forgotten))
        idle.until(rb"\$ ")  # the prompt; from now on nothing crosses
        started = time.monotonic()
        while time.monotonic() - started < 5:  # over two idle-sleep periods
            keys.send(b"x")  # typed, read by cat, nothing printed
            time.sleep(0.3)
        assert wait_until(lambda: status(forgotten) == "sleeping", WAIT_S), (
            "a terminal left open with nothing crossing it kept its container awake"
        )
        idle.until_closed()
        assert idle.ws.close_code == 1001
        assert "went to sleep" in (idle.ws.close_reason or "")
        assert status(ticking) == status(typing) == "running"
        ticks.until(rb"tick")  # both still open
        keys.send(b"x")
        assert keys.ws.close_code is None and ticks.ws.close_code is None
        ticks.ws.close()
        keys.ws.close()
