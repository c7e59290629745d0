"""``shellbox node`` over https: the node serves TLS with ``cluster.tls_cert_file`` and
``cluster.tls_key_file``, and ``RemoteRuntime`` checks it against ``cluster.node_ca_file``,
for its calls and for the WebSockets of terminals and ports alike. A node whose certificate
the caller does not trust is unavailable with a message saying so, never reached."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator

import pytest
from sandbox_helpers import make_state_dir, remove_state_dir

from node_helpers import NodeProcess
from shellbox.errors import NodeUnavailable, PortNotListening
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, PtyRequest
from shellbox.sandbox.remote import RemoteRuntime
from tls_helpers import Tls, make_tls


def tls_env(tls: Tls) -> dict[str, str]:
    return {
        "SHELLBOX_CLUSTER__TLS_CERT_FILE": str(tls.cert),
        "SHELLBOX_CLUSTER__TLS_KEY_FILE": str(tls.key),
    }


@pytest.fixture
def tls_node() -> Iterator[tuple[NodeProcess, Tls]]:
    state = make_state_dir("shellbox-node-tls-")
    tls = make_tls(state)
    node = NodeProcess(state, env=tls_env(tls), ca_file=tls.ca).start()
    yield node, tls
    try:
        node.destroy_all()
    finally:
        node.stop()
        remove_state_dir(state)


async def test_a_node_serves_https_and_its_streams_are_wss(
    tls_node: tuple[NodeProcess, Tls],
) -> None:
    node, tls = tls_node
    assert node.url.startswith("https://")
    remote = RemoteRuntime(node.url, node.key, name=node.name, ca_file=tls.ca)
    try:
        cid = new_id("cntr_")
        await remote.create(ContainerSpec(id=cid))
        await remote.start(cid)
        [result] = await remote.run(
            cid,
            ExecRequest(
                ["echo over tls; nohup python3 -m http.server --bind 127.0.0.1 8127 "
                 ">/dev/null 2>&1 &"],
                10_000,
                1000,
            ),
        )  # fmt: skip
        assert result.stdout == "over tls\n"
        term = await remote.pty(cid, PtyRequest(cols=80, rows=24))
        await term.write(b"echo $((6 * 7))\n")
        seen = b""

        async def until_answer() -> None:
            nonlocal seen
            async for chunk in term.output():
                seen += chunk
                if b"42" in seen:
                    return

        await asyncio.wait_for(until_answer(), 20)
        await term.close()
        for _ in range(200):  # the port's stream is a WebSocket too
            try:
                stream = await remote.connect_port(cid, 8127)
                break
            except PortNotListening:  # not listening yet
                await asyncio.sleep(0.05)
        await stream.send(b"GET / HTTP/1.0\r\n\r\n")
        assert (await asyncio.wait_for(stream.receive(), 10)).startswith(b"HTTP/1.0 200")
        await stream.aclose()
        await remote.destroy(cid)
    finally:
        await remote.aclose()


async def test_a_node_whose_certificate_is_not_trusted_is_not_reached(
    tls_node: tuple[NodeProcess, Tls],
) -> None:
    node, tls = tls_node
    other = make_tls(tls.ca.parent, ca_name="another CA")
    for ca_file in (None, other.ca):  # the system's trust store; a CA that did not sign it
        remote = RemoteRuntime(node.url, node.key, name=node.name, ca_file=ca_file)
        try:
            with pytest.raises(NodeUnavailable) as call:
                await remote.list()
            assert "TLS certificate is not trusted" in call.value.message
            assert "cluster.node_ca_file" in call.value.message
            with pytest.raises(NodeUnavailable) as stream:
                await remote.pty("cntr_x", PtyRequest(cols=80, rows=24))
            assert "TLS certificate is not trusted" in stream.value.message
        finally:
            await remote.aclose()


@pytest.mark.parametrize("broken", ["key readable by others", "certificate without key"])
def test_a_node_refuses_to_start_with_tls_half_set_up(broken: str) -> None:
    state = make_state_dir("shellbox-node-tls-bad-")
    try:
        tls = make_tls(state)
        env = tls_env(tls)
        if broken == "key readable by others":
            tls.key.chmod(0o644)
        else:
            del env["SHELLBOX_CLUSTER__TLS_KEY_FILE"]
        node = NodeProcess(state, env=env, ca_file=tls.ca)
        done = subprocess.run(
            node.command(), env=node.environment(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        expected = "0600" if broken == "key readable by others" else "go together"
        assert expected in done.stderr, done.stderr
    finally:
        remove_state_dir(state)
