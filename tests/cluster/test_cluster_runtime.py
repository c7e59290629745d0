"""``ClusterRuntime`` over two real runtimes standing for two nodes (each an ``OciRuntime`` on
its own state directory, registered in a real database by ``NodeRegistration``): placement,
routing of every kind of call, capacity, and a lost node's containers answering 503 until it
is back. The same over HTTP, with ``shellbox node`` processes, is in ``test_cluster.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_helpers import make_state_dir, remove_state_dir

from shellbox.cluster import ClusterRuntime, NodeRegistration
from shellbox.errors import (
    CapacityExceeded,
    ContainerNotFound,
    NodeUnavailable,
    PortNotListening,
)
from shellbox.ids import new_id
from shellbox.sandbox import (
    CommandFinished,
    ContainerSpec,
    ExecRequest,
    OciRuntime,
    OutputDelta,
    PtyRequest,
    Runtime,
    create_runtime,
)
from shellbox.settings import Settings
from shellbox.store import Stores, create_database, create_stores

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / ".state" / "images"
TIMEOUT_S = 1.5  # what the node-loss tests' runtime waits; the others' never lose a node


@dataclass
class Nodes:
    stores: Stores
    runtimes: dict[str, OciRuntime]
    registrations: dict[str, NodeRegistration]
    cluster: ClusterRuntime


@pytest.fixture(scope="module")
async def nodes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Nodes]:
    db = create_database(f"sqlite:///{tmp_path_factory.mktemp('db') / 'private' / 'c.db'}")
    stores = create_stores(db)
    runtimes: dict[str, OciRuntime] = {}
    registrations: dict[str, NodeRegistration] = {}
    dirs = []
    for name in ("n1", "n2"):
        state = make_state_dir(f"shellbox-{name}-")
        dirs.append(state)
        settings = Settings(
            state_dir=state, runtime={"image_dir": IMAGE_DIR, "image_profile": "minimal"}
        )
        runtimes[name] = create_runtime(settings)
        # Heartbeats only when a test beats (``beat``).
        registrations[name] = NodeRegistration(
            stores.nodes,
            runtimes[name],
            name=name,
            url=f"http://{name}.invalid",
            memory_bytes=3 * GIB,
            heartbeat_s=3600,
        )
        await registrations[name].start()
    spool = tmp_path_factory.mktemp("spool")
    cluster = ClusterRuntime(
        stores.nodes,
        lambda node: runtimes[node.name],
        node_timeout_s=3600,
        spool_dir=spool / "skills",
    )
    yield Nodes(stores, runtimes, registrations, cluster)
    for reg in registrations.values():
        await reg.stop()
    for rt in runtimes.values():
        for info in await rt.list():
            await rt.destroy(info.id)
    for state in dirs:
        remove_state_dir(state)
    db.dispose()


async def beat(nodes: Nodes, *names: str) -> None:
    for name in names or tuple(nodes.registrations):
        await nodes.registrations[name].beat()


async def sh(rt: Runtime, cid: str, command: str) -> str:
    [result] = await rt.run(cid, ExecRequest([command], 20_000, 10_000))
    assert result.outcome.exit_code == 0, result.stderr
    return result.stdout


async def read_all(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in chunks])


async def test_containers_spread_and_every_call_reaches_their_node(nodes: Nodes) -> None:
    rt: Runtime = nodes.cluster  # the protocol, as the service layer sees it
    await beat(nodes)
    cids = [new_id("cntr_") for _ in range(4)]
    try:
        for cid in cids:
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)
        held = {name: {i.id for i in await r.list()} for name, r in nodes.runtimes.items()}
        assert [len(held[n] & set(cids)) for n in ("n1", "n2")] == [2, 2]
        assert {i.id for i in await rt.list()} >= set(cids)
        for cid in cids:
            await rt.write_file(cid, "in.txt", [b"hello ", cid.encode()])
            assert await sh(rt, cid, "cat /mnt/data/in.txt") == f"hello {cid}"
            assert await read_all(await rt.read_file(cid, "in.txt")) == f"hello {cid}".encode()
            stat = await rt.stat_file(cid, "in.txt")
            assert stat is not None and stat.size == 6 + len(cid)
            assert [f.path for f in await rt.list_files(cid)] == ["in.txt"]
        events = [e async for e in rt.exec(cids[0], ExecRequest(["echo streamed"], 20_000, 10_000))]
        assert any(isinstance(e, OutputDelta) and "streamed" in e.text for e in events)
        assert isinstance(events[-1], CommandFinished)
        await rt.pause(cids[1])
        assert await rt.state(cids[1]) == "paused"
        await rt.resume(cids[1])
        await rt.remove_file(cids[1], "in.txt")
        assert await rt.stat_file(cids[1], "in.txt") is None
        assert rt.describe().image_profile == "minimal"
    finally:
        for cid in cids:
            await rt.destroy(cid)
    for cid in cids:
        assert nodes.stores.nodes.node_of(cid) is None
        with pytest.raises(ContainerNotFound):
            await rt.state(cid)
        await rt.destroy(cid)  # idempotent


async def test_ports_terminals_and_memory_reach_the_container_node(nodes: Nodes) -> None:
    rt: Runtime = nodes.cluster
    await beat(nodes)
    cids = [new_id("cntr_") for _ in range(2)]  # one on each node
    try:
        for cid in cids:
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)
            await sh(
                rt,
                cid,
                "nohup python3 -c 'import socket; s = socket.socket(); "
                's.bind(("127.0.0.1", 8127)); s.listen(); c, _ = s.accept(); '
                "c.sendall(c.recv(100).upper())' >/dev/null 2>&1 &",
            )
        for cid in cids:
            for _ in range(200):
                try:
                    stream = await rt.connect_port(cid, 8127)
                    break
                except PortNotListening:
                    await asyncio.sleep(0.05)
            await stream.send(cid.encode())
            assert await stream.receive() == cid.upper().encode()
            await stream.aclose()
            used = await rt.memory_usage(cid)
            assert used is not None and used > 0
            term = await rt.pty(cid, PtyRequest(cols=80, rows=24, command="exit 7"))
            async for _ in term.output():
                pass
            assert term.exit_code == 7
        assert await rt.memory_usage(new_id("cntr_")) is None  # placed nowhere
    finally:
        for cid in cids:
            await rt.destroy(cid)


async def test_a_container_needs_a_node_with_its_memory_free(nodes: Nodes) -> None:
    await beat(nodes)
    with pytest.raises(CapacityExceeded, match="4 GiB of memory free"):
        await nodes.cluster.create(ContainerSpec(id=new_id("cntr_"), memory_limit="4g"))
    cids = [new_id("cntr_") for _ in range(6)]
    try:
        for cid in cids:  # 3 GiB on each node: six 1g containers fill both
            await nodes.cluster.create(ContainerSpec(id=cid))
        with pytest.raises(CapacityExceeded, match="1 GiB of memory free"):
            await nodes.cluster.create(ContainerSpec(id=new_id("cntr_")))
    finally:
        for cid in cids:
            await nodes.cluster.destroy(cid)
    extra = new_id("cntr_")
    await nodes.cluster.create(ContainerSpec(id=extra))  # room again
    await nodes.cluster.destroy(extra)


def impatient(nodes: Nodes) -> ClusterRuntime:
    """A replica's runtime that takes a node silent for TIMEOUT_S for lost."""
    return ClusterRuntime(
        nodes.stores.nodes,
        lambda node: nodes.runtimes[node.name],
        node_timeout_s=TIMEOUT_S,
        spool_dir=nodes.cluster.spool_dir.parent / "impatient",
    )


async def test_a_lost_node_answers_503_until_it_is_back(nodes: Nodes) -> None:
    rt = impatient(nodes)
    await beat(nodes)
    a, b = new_id("cntr_"), new_id("cntr_")
    try:
        for cid in (a, b):
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)
            await rt.write_file(cid, "kept.txt", [cid.encode()])
        node_a = nodes.stores.nodes.node_of(a)
        node_b = nodes.stores.nodes.node_of(b)
        assert node_a is not None and node_b is not None and node_a.name != node_b.name
        await asyncio.sleep(TIMEOUT_S + 0.5)
        await beat(nodes, node_b.name)  # only b's node is alive: a's is lost
        with pytest.raises(NodeUnavailable, match=f"'{node_a.name}', which is unavailable"):
            await rt.run(a, ExecRequest(["true"], 20_000, 100))
        with pytest.raises(NodeUnavailable, match="no heartbeat for"):
            await rt.read_file(a, "kept.txt")
        with pytest.raises(NodeUnavailable):
            await rt.connect_port(a, 8000)
        with pytest.raises(NodeUnavailable):
            await rt.pty(a, PtyRequest(cols=80, rows=24))
        assert await rt.memory_usage(a) is None  # (a figure for display: no error)
        assert await sh(rt, b, "cat /mnt/data/kept.txt") == b
        fresh = new_id("cntr_")
        await rt.create(ContainerSpec(id=fresh))  # goes where it can
        assert nodes.stores.nodes.node_of(fresh).name == node_b.name  # type: ignore[union-attr]
        await rt.destroy(fresh)
        await beat(nodes, node_a.name, node_b.name)  # back, with its state directory
        assert await sh(rt, a, "cat /mnt/data/kept.txt") == a
        await nodes.registrations[node_a.name].stop()  # a clean stop: unavailable at once
        with pytest.raises(NodeUnavailable, match="it was stopped"):
            await rt.state(a)
        await nodes.registrations[node_a.name].start()
        assert await rt.state(a) == "running"
    finally:
        await beat(nodes)
        for cid in (a, b):
            await rt.destroy(cid)


async def test_no_node_at_all_is_a_503(nodes: Nodes) -> None:
    await asyncio.sleep(TIMEOUT_S + 0.5)  # both silent
    with pytest.raises(NodeUnavailable, match="no sandbox node is available"):
        await impatient(nodes).create(ContainerSpec(id=new_id("cntr_")))
    await beat(nodes)
