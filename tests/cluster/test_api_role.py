"""Two API replicas (``cluster.role = "api"``: real ``Services`` and the real app, driven by
the official ``openai`` SDK and httpx through ASGI, in this process) over one PostgreSQL
database and two sandbox nodes (real ``OciRuntime``s on their own state directories,
registered with heartbeats this test beats): any replica serves any container, Files API bytes
are shared through the database, a lost node's containers answer 503 ``node_unavailable`` over
HTTP until it beats again, and the two replicas put a container to sleep, and expire it, once.
The same with ``shellbox node`` and ``shellbox serve --role api`` processes behind HAProxy is in
``test_cluster.py``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_helpers import make_state_dir, remove_state_dir
from sqlalchemy import event

from shellbox.app import create_app
from shellbox.cli import main
from shellbox.cluster import NodeRegistration
from shellbox.errors import InvalidRequest
from shellbox.sandbox import OciRuntime, create_runtime
from shellbox.services import Services, create_services
from shellbox.settings import Settings
from shellbox.store import create_database, create_stores

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / ".state" / "images"
GIB = 1 << 30
# Generous: the replicas, the nodes and the heartbeats share this process's one event loop,
# which a loaded machine slows down.
NODE_TIMEOUT_S = 5.0
REAPER_INTERVAL_S = 1.0  # the reaper lease lapses after three rounds unrenewed
IDLE_SLEEP_S = 4.0
MINUTE_S = 4.0  # an expires_after minute


@dataclass
class Replica:
    services: Services
    http: httpx.AsyncClient
    sdk: openai.AsyncOpenAI


@dataclass
class Cluster:
    a: Replica
    b: Replica
    runtimes: dict[str, OciRuntime]
    registrations: dict[str, NodeRegistration]
    beating: dict[str, asyncio.Task[None]]

    def node_of(self, cid: str) -> str:
        node = self.a.services.stores.nodes.node_of(cid)
        assert node is not None
        return node.name

    def start_beating(self, name: str) -> None:
        async def beat_forever() -> None:
            while True:
                await self.registrations[name].beat()
                await asyncio.sleep(0.3)

        self.beating[name] = asyncio.create_task(beat_forever())

    async def stop_beating(self, name: str) -> None:
        """The node goes silent, as a node killed with ``kill -9`` does."""
        task = self.beating.pop(name)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def replica_settings(state: Path, url: str, key_file: Path) -> Settings:
    return Settings(
        state_dir=state,
        runtime={"image_dir": IMAGE_DIR, "image_profile": "minimal"},
        store={"database_url": url},
        cluster={"role": "api", "key_file": key_file, "node_timeout_s": NODE_TIMEOUT_S},
        lifecycle={
            "reaper_interval_s": REAPER_INTERVAL_S,
            "idle_sleep_s": IDLE_SLEEP_S,
            "minute_s": MINUTE_S,
        },
    )


@pytest.fixture(scope="module")
async def cluster(pg_cluster: Any) -> AsyncIterator[Cluster]:
    url = pg_cluster.new_database()
    dirs = [make_state_dir(f"shellbox-{n}-") for n in ("node1", "node2", "api1", "api2")]
    key_file = dirs[2] / "cluster.key"
    key_file.write_text("unused: the replicas reach these nodes in-process")
    db = create_database(url)
    stores = create_stores(db)
    runtimes: dict[str, OciRuntime] = {}
    registrations: dict[str, NodeRegistration] = {}
    for name, state in zip(("node1", "node2"), dirs, strict=False):
        runtimes[name] = create_runtime(
            Settings(state_dir=state, runtime={"image_dir": IMAGE_DIR, "image_profile": "minimal"})
        )
        registrations[name] = NodeRegistration(
            stores.nodes,
            runtimes[name],
            name=name,
            url=f"http://{name}.invalid",
            memory_bytes=16 * GIB,
            heartbeat_s=3600,  # beaten by the test (Cluster.start_beating)
        )
        await registrations[name].start()
    replicas = []
    for state in dirs[2:]:
        services = create_services(
            replica_settings(state, url, key_file), connect=lambda node: runtimes[node.name]
        )
        await services.start()
        app = create_app(services.settings, services)
        app.state.services = services  # what the lifespan does; ASGI transport runs none
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://replica",
            timeout=60,
            headers={"authorization": "Bearer open"},  # no keys yet, loopback: open
        )
        sdk = openai.AsyncOpenAI(
            base_url="http://replica/v1", api_key="open", http_client=http, max_retries=0
        )
        replicas.append(Replica(services, http, sdk))
    c = Cluster(replicas[0], replicas[1], runtimes, registrations, {})
    for name in registrations:
        c.start_beating(name)
    yield c
    for name in list(c.beating):
        await c.stop_beating(name)
    for r in replicas:
        await r.http.aclose()
        await r.services.close()
    for reg in registrations.values():
        await reg.stop()
    for rt in runtimes.values():
        for info in await rt.list():
            await rt.destroy(info.id)
    db.dispose()
    for state in dirs:
        remove_state_dir(state)


async def shell(http: httpx.AsyncClient, cid: str, command: str) -> httpx.Response:
    return await http.post(
        f"/v1/containers/{cid}/calls",
        json={"type": "shell_call", "call_id": "c", "action": {"commands": [command]}},
    )


def stdout(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["output"][0]["stdout"])


async def eventually(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.2)
    return bool(await predicate())


def test_an_api_replica_needs_postgresql_and_a_cluster_key(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, cluster={"role": "api", "key_file": tmp_path / "k"})
    with pytest.raises(InvalidRequest, match=r"needs store\.database_url to be a PostgreSQL URL"):
        create_services(settings)
    settings = Settings(
        state_dir=tmp_path,
        store={"database_url": "postgresql+psycopg://u@/db?host=/nonexistent"},
        cluster={"role": "api"},
    )
    with pytest.raises(InvalidRequest, match=r"needs cluster\.key_file"):
        create_services(settings)


def test_serve_as_an_api_replica_refuses_sqlite_before_touching_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shellbox serve --role api`` without a PostgreSQL URL says why and exits: no state
    directory, no SQLite database made (and so migrated) on the way."""
    state = tmp_path / "state"
    key_file = tmp_path / "cluster.key"
    key_file.write_text("k" * 44)
    key_file.chmod(0o600)
    argv = ["serve", "--role", "api", "--state-dir", str(state)]
    assert main([*argv, "--cluster-key-file", str(key_file)]) == 2
    said = capsys.readouterr().err
    assert "cluster.role 'api' needs store.database_url to be a PostgreSQL URL" in said
    assert main([*argv, "--database-url", f"sqlite:///{tmp_path}/api.db"]) == 2
    assert not state.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.key"]


async def test_any_replica_serves_any_container_and_any_file(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    made = [await (a if i % 2 else b).sdk.containers.create(name=f"c{i}") for i in range(4)]
    try:
        assert sorted(cluster.node_of(c.id) for c in made) == ["node1"] * 2 + ["node2"] * 2
        blob = bytes(range(256)) * 9000  # 2.3 MB: three chunks in the database
        uploaded = await a.sdk.files.create(file=("data.bin", blob), purpose="user_data")
        assert await (await b.sdk.files.content(uploaded.id)).aread() == blob
        for c in made:
            cf = await a.sdk.containers.files.create(c.id, file=("f.txt", c.id.encode()))
            assert stdout(await shell(b.http, c.id, "cat /mnt/data/f.txt")) == c.id
            got = await b.sdk.containers.files.content.retrieve(cf.id, container_id=c.id)
            assert await got.aread() == c.id.encode()
            r = await b.http.post(f"/v1/containers/{c.id}/files", json={"file_id": uploaded.id})
            assert r.status_code == 200, r.text
            assert stdout(await shell(a.http, c.id, "wc -c < data.bin")).strip() == str(len(blob))
        # a streamed call through the other replica
        async with b.http.stream(
            "POST",
            f"/v1/containers/{made[0].id}/calls?stream=true",
            json={"type": "shell_call", "call_id": "s", "action": {"commands": ["echo hi"]}},
        ) as r:
            assert r.status_code == 200
            assert '"hi\\n"' in (await r.aread()).decode()
        await b.sdk.files.delete(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            await a.sdk.files.content(uploaded.id)
    finally:
        for c in made:
            await b.sdk.containers.delete(c.id)
    for c in made:
        assert cluster.a.services.stores.nodes.node_of(c.id) is None  # removed from its node


async def test_a_call_cites_what_the_other_replica_indexed_while_it_ran(
    cluster: Cluster,
) -> None:
    """A file the call wrote is its own even when the other replica's listing indexed it
    first (so that this replica's sync at the end finds the rows already up to date); what
    was there before the call is not cited."""
    a, b = cluster.a, cluster.b
    c = await a.sdk.containers.create(name="cites")
    try:
        assert stdout(await shell(a.http, c.id, "echo old > old.txt; echo ok")) == "ok\n"
        call = asyncio.create_task(shell(a.http, c.id, "echo new > new.txt; sleep 3"))

        async def b_indexed() -> bool:
            listed = await b.sdk.containers.files.list(c.id)
            return "/mnt/data/new.txt" in {f.path async for f in listed}

        assert await eventually(b_indexed, 3) and not call.done()
        r = await call
        assert r.status_code == 200, r.text
        assert [f["filename"] for f in r.json()["files"]] == ["new.txt"]
        quiet = await shell(a.http, c.id, "cat new.txt old.txt")
        assert quiet.status_code == 200 and quiet.json()["files"] == []
    finally:
        await a.sdk.containers.delete(c.id)


async def test_a_call_reads_the_containers_file_rows_once(cluster: Cluster) -> None:
    """A call on a replica reads the container's index rows once (its change mark), and its
    sync at the end compares the listing with those rows rather than reading them again
    (an upsert still reads back the one row it wrote); what it wrote is still cited, and the
    rows say what the directory holds."""
    a = cluster.a
    c = await a.sdk.containers.create(name="one-read")
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        """The reads of all the container's rows (not an upsert's read-back of its one row)."""
        where = statement.partition("WHERE")[2]
        whole = where.count("=") == 1 and "container_id =" in where and c.id in str(params)
        if statement.startswith("SELECT") and "FROM container_files" in statement and whole:
            reads.append(statement)

    engine = a.services.db.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        for command, cited in (
            ("echo one > one.txt", ["one.txt"]),
            ("echo two > two.txt; rm one.txt", ["two.txt"]),
            ("cat two.txt", []),
        ):
            reads.clear()
            r = await shell(a.http, c.id, command)
            assert r.status_code == 200, r.text
            assert [f["filename"] for f in r.json()["files"]] == cited
            assert len(reads) == 1, reads
        rows = a.services.stores.container_files.for_container(c.id)
        assert sorted(f.path for f in rows) == ["two.txt"]
    finally:
        event.remove(engine, "before_cursor_execute", count)
        await a.sdk.containers.delete(c.id)


async def test_a_lost_node_answers_503_until_it_beats_again(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    made = [await a.sdk.containers.create(name=f"n{i}") for i in range(2)]
    lost = next(c for c in made if cluster.node_of(c.id) == "node1")
    kept = next(c for c in made if cluster.node_of(c.id) == "node2")
    for c in made:
        assert stdout(await shell(b.http, c.id, f"echo {c.id} > mine.txt")) == ""
    await cluster.stop_beating("node1")
    try:
        started = time.monotonic()
        assert await eventually(
            lambda: _status(shell(a.http, lost.id, "cat mine.txt"), 503), NODE_TIMEOUT_S + 5
        )
        assert time.monotonic() - started <= NODE_TIMEOUT_S + 5
        for replica in (a, b):
            r = await shell(replica.http, lost.id, "cat mine.txt")
            assert r.status_code == 503
            assert r.headers["x-should-retry"] == "true"
            err = r.json()["error"]
            assert err["code"] == "node_unavailable" and err["type"] == "server_error"
            assert "'node1', which is unavailable (no heartbeat for" in err["message"]
            files = await replica.http.get(f"/v1/containers/{lost.id}/files")
            assert files.status_code == 503
            listed = [c.id async for c in replica.sdk.containers.list()]
            assert lost.id in listed  # still listed
            assert stdout(await shell(replica.http, kept.id, "cat mine.txt")) == f"{kept.id}\n"
        fresh = [await b.sdk.containers.create(name=f"f{i}") for i in range(2)]
        assert {cluster.node_of(c.id) for c in fresh} == {"node2"}
        for c in fresh:
            await a.sdk.containers.delete(c.id)
    finally:
        cluster.start_beating("node1")
    assert await eventually(lambda: _status(shell(b.http, lost.id, "true"), 200), 10)
    assert stdout(await shell(b.http, lost.id, "cat mine.txt")) == f"{lost.id}\n"
    for c in made:
        await b.sdk.containers.delete(c.id)


async def _status(response: Any, status: int) -> bool:
    r: httpx.Response = await response
    return r.status_code == status


async def test_two_replicas_put_a_container_to_sleep_and_expire_it_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shellbox.containers")
    a, b = cluster.a, cluster.b
    c = await a.sdk.containers.create(
        name="racing", expires_after={"anchor": "last_active_at", "minutes": 2}
    )
    assert stdout(await shell(b.http, c.id, "echo up")) == "up\n"

    async def status_is(status: str) -> bool:
        return (await b.sdk.containers.retrieve(c.id)).status == status

    assert await eventually(lambda: status_is("sleeping"), IDLE_SLEEP_S + 10)
    assert cluster.runtimes[cluster.node_of(c.id)] is not None
    assert stdout(await shell(a.http, c.id, "echo awake")) == "awake\n"  # a call wakes it
    assert await eventually(lambda: status_is("expired"), 2 * MINUTE_S + 10)
    await asyncio.sleep(1)  # a second sleep or expiry would be logged by now
    said = [r.getMessage() for r in caplog.records if c.id in r.getMessage()]
    assert said.count(f"container {c.id} fell asleep") == 2, said  # before and after the wake
    assert said.count(f"container {c.id} expired") == 1, said
    # its sandbox is gone from its node, and so is its placement
    assert c.id not in {i.id for rt in cluster.runtimes.values() for i in await rt.list()}
    assert cluster.a.services.stores.nodes.node_of(c.id) is None


async def test_a_replica_that_stops_hands_the_reaper_over(cluster: Cluster) -> None:
    leases = cluster.a.services.stores.leases
    replicas = [cluster.a, cluster.b]
    tokens = {r.services.containers.lease.holder for r in replicas}  # type: ignore[union-attr]

    async def held_by_one() -> bool:
        return leases.holder("reaper") in tokens

    assert await eventually(held_by_one, 5 * REAPER_INTERVAL_S)
    holder = leases.holder("reaper")
    held = [r for r in replicas if r.services.containers.lease.holder == holder]  # type: ignore[union-attr]
    assert len(held) == 1
    other = next(r for r in replicas if r is not held[0])
    await held[0].services.containers.stop_reaper()  # a clean stop gives the lease up at once
    try:
        c = await other.sdk.containers.create(name="handed-over")
        assert await eventually(lambda: _retrieved(other, c.id, "sleeping"), IDLE_SLEEP_S + 5)
        assert leases.holder("reaper") == other.services.containers.lease.holder  # type: ignore[union-attr]
        await other.sdk.containers.delete(c.id)
    finally:
        held[0].services.containers.start_reaper()


async def _retrieved(replica: Replica, cid: str, status: str) -> bool:
    return (await replica.sdk.containers.retrieve(cid)).status == status


def _zip(entries: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


async def test_a_skill_uploaded_through_one_replica_mounts_through_the_other(
    cluster: Cluster,
) -> None:
    import base64

    a, b = cluster.a, cluster.b
    bundle = _zip(
        {
            "greeter/SKILL.md": b"---\nname: greeter\ndescription: Greets.\n---\nSay hi.\n",
            "greeter/hello.txt": b"hello from the skill\n",
        }
    )
    skill = await a.sdk.skills.create(files=("greeter.zip", bundle, "application/zip"))
    inline_zip = _zip({"tiny/SKILL.md": b"---\nname: tiny\ndescription: Tiny.\n---\nx\n"})
    made = []
    try:
        for i in range(2):  # one on each node: each gets the skill from b's spool
            c = await b.sdk.containers.create(
                name=f"skilled{i}",
                skills=[
                    {"type": "skill_reference", "skill_id": skill.id},
                    {
                        "type": "inline",
                        "name": "tiny",
                        "description": "Tiny.",
                        "source": {
                            "type": "base64",
                            "media_type": "application/zip",
                            "data": base64.b64encode(inline_zip).decode(),
                        },
                    },
                ],
            )
            made.append(c)
        assert {cluster.node_of(c.id) for c in made} == {"node1", "node2"}
        for c in made:
            r = await shell(
                a.http, c.id, "cat /mnt/skills/greeter/hello.txt /mnt/skills/tiny/SKILL.md"
            )
            assert stdout(r).startswith("hello from the skill\n---\nname: tiny")
        content = await b.http.get(f"/v1/skills/{skill.id}/content")
        assert content.status_code == 200 and content.content == bundle  # from the database
    finally:
        for c in made:
            await a.sdk.containers.delete(c.id)
        await b.sdk.skills.delete(skill.id)
    with pytest.raises(openai.NotFoundError):
        await a.sdk.skills.retrieve(skill.id)


async def test_a_replica_forgets_the_containers_the_other_replica_ended(cluster: Cluster) -> None:
    """What a replica keeps in memory of a container it served (its record, its lock, its
    files' index) goes within a reaper round of the container's end through the other
    replica, which alone runs the features' ``release``: nothing grows with the containers
    a long-lived replica has served."""
    a, b = cluster.a, cluster.b
    made = [await a.sdk.containers.create(name=f"forgotten{i}") for i in range(4)]
    ids = {c.id for c in made}
    for c in made:
        assert stdout(await shell(b.http, c.id, "echo x > f.txt; echo ok")) == "ok\n"
        assert [f.path async for f in await b.sdk.containers.files.list(c.id)] == [
            "/mnt/data/f.txt"
        ]
    paused = await b.http.post(f"/v1/containers/{made[0].id}/pause")
    assert paused.status_code == 200, paused.text
    assert ids <= b.services.containers.remembered()
    assert ids <= b.services.files.remembered()
    for c in made:
        await a.sdk.containers.delete(c.id)
    assert not ids & a.services.containers.remembered()  # ended there: forgotten at once

    async def forgotten() -> bool:
        return not ids & b.services.containers.remembered()

    assert await eventually(forgotten, 3 * REAPER_INTERVAL_S + 5)
    assert not ids & b.services.files.remembered()
