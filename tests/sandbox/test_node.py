"""``shellbox node``: only callers with the cluster key reach its runtime, it refuses a key
file others can read, and a node that is gone is a ``NodeUnavailable`` (503) at once, never
a hang nor a 500. (What the node serves is the runtime contract suite's, ``node`` param.)"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from sandbox_helpers import WAIT_S, host_pids, make_state_dir, remove_state_dir, wait_gone

from node_helpers import NodeProcess, free_port, write_key_file
from process_helpers import destroy_all_sandboxes
from shellbox.errors import (
    ContainerNotFound,
    FileNotFound,
    InvalidRequest,
    NodeUnavailable,
    PortNotListening,
    SandboxError,
)
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, PtyRequest
from shellbox.sandbox.remote import RemoteRuntime


@pytest.fixture
def own_node() -> Iterator[NodeProcess]:
    """A node of this test's own (it may be killed)."""
    state = make_state_dir("shellbox-node-own-")
    node = NodeProcess(state).start()
    yield node
    node.stop()
    destroy_all_sandboxes(state)  # the node may be dead: through a runtime of this process
    remove_state_dir(state)


def test_only_the_cluster_key_reaches_the_runtime(node: NodeProcess) -> None:
    with httpx.Client(base_url=node.url, timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": node.key}):
            r = http.post("/v1/runtime/list", json={}, headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "invalid_api_key"
        ok = http.post("/v1/runtime/list", json={}, headers={"authorization": f"Bearer {node.key}"})
        assert ok.status_code == 200, ok.text
        assert http.get("/healthz").json()["node"] == node.name  # a probe needs no key


async def test_a_wrong_key_is_an_error_not_a_container(node: NodeProcess) -> None:
    remote = RemoteRuntime(node.url, "not-the-cluster-key-at-all")
    try:
        with pytest.raises(Exception, match="refused the cluster key"):
            await remote.list()
    finally:
        await remote.aclose()


async def test_driver_errors_cross_as_their_class(node: NodeProcess) -> None:
    remote = RemoteRuntime(node.url, node.key)
    try:
        with pytest.raises(ContainerNotFound):
            await remote.run("cntr_nosuchcontainer", ExecRequest(["true"], 1000, 100))
        with pytest.raises(FileNotFound) as caught:
            await remote.read_file("cntr_nosuchcontainer", "a.txt", param="file")
        assert caught.value.param == "file" and caught.value.status == 404
    finally:
        await remote.aclose()


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    state = make_state_dir("shellbox-node-key-")
    try:
        node = NodeProcess(state, key_file=write_key_file(tmp_path, mode=0o644))
        done = subprocess.run(
            node.command(), env=node.environment(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2
        assert "0600" in done.stderr
    finally:
        remove_state_dir(state)


async def test_a_node_that_is_down_is_unavailable_at_once() -> None:
    remote = RemoteRuntime(f"http://127.0.0.1:{free_port()}", "k" * 32, name="gone")
    try:
        started = time.monotonic()
        with pytest.raises(NodeUnavailable) as caught:
            await remote.state("cntr_x")
        assert time.monotonic() - started < 3
        assert caught.value.status == 503
        assert "the node gone is unavailable" in str(caught.value)
    finally:
        await remote.aclose()


async def test_a_node_killed_mid_command_is_unavailable(own_node: NodeProcess) -> None:
    remote = RemoteRuntime(own_node.url, own_node.key, name=own_node.name)
    try:
        cid = new_id("cntr_")
        await remote.create(ContainerSpec(id=cid))
        await remote.start(cid)
        events = remote.exec(cid, ExecRequest(["echo started; sleep 60"], 120_000, 1000))
        first = await anext(events)  # the command runs
        assert first is not None
        started = time.monotonic()
        own_node.kill()
        with pytest.raises(NodeUnavailable, match=f"the node {own_node.name} is unavailable"):
            async for _ in events:
                pass
        assert time.monotonic() - started < 5
        with pytest.raises(NodeUnavailable):
            await asyncio.wait_for(remote.list(), 10)
        # Back with its state directory: its container is there, with its disk.
        own_node.start()
        assert cid in {i.id for i in await remote.list()}
    finally:
        await remote.aclose()


@pytest.mark.parametrize("leave", ["aclose", "cancel"])
async def test_leaving_a_command_kills_it_on_the_node(node: NodeProcess, leave: str) -> None:
    """A caller that stops reading a command's events (its own client went away) ends the
    command on the node at once, as with a local runtime, whether it closes the iterator or
    its task is cancelled mid-read; the sandbox works on."""
    remote = RemoteRuntime(node.url, node.key, name=node.name)
    cid = new_id("cntr_")
    marker = f"left-{secrets.token_hex(6)}"
    try:
        await remote.create(ContainerSpec(id=cid))
        await remote.start(cid)
        request = ExecRequest([f"echo go; exec -a {marker} sleep 100"], 120_000, 1000, stream=True)
        events = remote.exec(cid, request)
        if leave == "aclose":
            await anext(events)  # "go": the command runs
            assert await wait_for_pids(marker)
            await events.aclose()  # type: ignore[attr-defined]
        else:

            async def read_all() -> None:
                async for _ in events:
                    pass

            task = asyncio.create_task(read_all())
            assert await wait_for_pids(marker)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert await wait_gone(marker) == []
        [after] = await remote.run(cid, ExecRequest(["echo fine"], 10_000, 100))
        assert after.stdout == "fine\n"
    finally:
        await remote.destroy(cid)
        await remote.aclose()


async def wait_for_pids(pattern: str, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not host_pids(pattern):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_paths_from_the_wire_must_be_normalised(node: NodeProcess) -> None:
    """The driver walks a path it was given normalised: the node refuses any other, so a
    caller cannot climb out of /mnt/data with ``..``."""
    remote = RemoteRuntime(node.url, node.key)
    cid = new_id("cntr_")
    await remote.create(ContainerSpec(id=cid))
    try:
        await remote.write_file(cid, "x.txt", [b"inside"])
        auth = {"authorization": f"Bearer {node.key}"}
        async with httpx.AsyncClient(base_url=node.url, headers=auth, timeout=30) as http:
            for method, rel in [
                ("read_file", "../data/x.txt"),
                ("stat_file", "../data/x.txt"),
                ("remove_file", "/mnt/data/x.txt"),
                ("read_file", "./x.txt"),
            ]:
                args = {"container_id": cid, "rel": rel, "follow_links": False, "param": "path"}
                r = await http.post(f"/v1/runtime/{method}", json=args)
                assert r.status_code == 400, (method, rel, r.text)
                assert r.json()["error"]["class"] in ("InvalidRequest", "PathOutsideWorkspace")
        assert await remote.stat_file(cid, "x.txt") is not None  # still there
    finally:
        await remote.destroy(cid)
        await remote.aclose()


async def test_streams_need_the_cluster_key(node: NodeProcess) -> None:
    remote = RemoteRuntime(node.url, "not-the-cluster-key-at-all")
    try:
        with pytest.raises(SandboxError, match="refused the cluster key"):
            await remote.connect_port("cntr_nosuchcontainer", 8000)
        with pytest.raises(SandboxError, match="refused the cluster key"):
            await remote.pty("cntr_nosuchcontainer", PtyRequest(cols=80, rows=24))
    finally:
        await remote.aclose()


async def test_a_bad_port_is_refused_before_the_stream(node: NodeProcess) -> None:
    remote = RemoteRuntime(node.url, node.key)
    try:
        with pytest.raises(InvalidRequest) as caught:
            await remote.connect_port("cntr_nosuchcontainer", 70000)
        assert caught.value.param == "port" and caught.value.status == 400
    finally:
        await remote.aclose()


async def test_streams_of_a_node_that_is_down_are_unavailable_at_once() -> None:
    remote = RemoteRuntime(f"http://127.0.0.1:{free_port()}", "k" * 32, name="gone")
    try:
        started = time.monotonic()
        with pytest.raises(NodeUnavailable) as caught:
            await remote.connect_port("cntr_x", 8000)
        assert caught.value.status == 503
        with pytest.raises(NodeUnavailable, match="the node gone is unavailable"):
            await remote.pty("cntr_x", PtyRequest(cols=80, rows=24))
        assert time.monotonic() - started < 3
    finally:
        await remote.aclose()


async def test_a_node_that_takes_no_connection_is_unavailable_within_the_connect_timeout() -> None:
    # A listener whose queue is full: the kernel drops further connection attempts, as for a
    # machine that does not answer.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        host, port = listener.getsockname()
        queued = []
        try:
            for _ in range(4):
                s = socket.socket()
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    s.connect((host, port))
                queued.append(s)
            remote = RemoteRuntime(f"http://{host}:{port}", "k" * 32, connect_timeout_s=1.0)
            try:
                started = time.monotonic()
                with pytest.raises(NodeUnavailable):
                    await remote.connect_port("cntr_x", 8000)
                assert 0.9 < time.monotonic() - started < 3
            finally:
                await remote.aclose()
        finally:
            for s in queued:
                s.close()


async def test_a_node_killed_mid_stream_breaks_it(own_node: NodeProcess) -> None:
    remote = RemoteRuntime(own_node.url, own_node.key, name=own_node.name)
    try:
        cid = new_id("cntr_")
        await remote.create(ContainerSpec(id=cid))
        await remote.start(cid)
        await remote.run(
            cid,
            ExecRequest(
                ["nohup python3 -m http.server --bind 127.0.0.1 8126 >/dev/null 2>&1 &"],
                10_000,
                1000,
            ),
        )
        stream = None
        for _ in range(200):
            with contextlib.suppress(PortNotListening):
                stream = await remote.connect_port(cid, 8126)
                break
            await asyncio.sleep(0.05)
        assert stream is not None
        term = await remote.pty(cid, PtyRequest(cols=80, rows=24))
        own_node.kill()
        with pytest.raises(anyio.BrokenResourceError):
            await asyncio.wait_for(stream.receive(), 5)

        async def drain() -> None:
            async for _ in term.output():
                pass

        await asyncio.wait_for(drain(), 5)  # the terminal ends, but not with an exit code
        assert term.exit_code is None
        await stream.aclose()
        await term.close()
        own_node.start()  # back, so that the fixture removes its container
    finally:
        await remote.aclose()
