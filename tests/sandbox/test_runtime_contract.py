"""The ``Runtime`` contract: what the service layer may rely on, whatever runs the sandboxes.

Every method of ``shellbox.sandbox.base.Runtime`` is exercised here through the protocol
alone (no driver attribute, no host path), once per driver: ``OciRuntime`` on crun and on
runc (the ``oci`` fixture), each used in this process (``local``) and through a
``RemoteRuntime`` talking to a ``shellbox node`` subprocess on a loopback port (``node``).
A Kubernetes runtime joins by adding its fixture.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
import tarfile
from collections.abc import AsyncIterator, Iterator

import pytest
from anyio import ClosedResourceError, EndOfStream
from anyio.abc import ByteStream

from shellbox.errors import (
    ContainerNotFound,
    FileNotFound,
    InvalidRequest,
    PathOutsideWorkspace,
    PayloadTooLarge,
    PortNotListening,
)
from shellbox.ids import new_id
from shellbox.patch import parse_patch
from shellbox.sandbox import (
    CommandFinished,
    CommandStarted,
    ContainerSpec,
    ExecRequest,
    FileInfo,
    OciRuntime,
    OutputDelta,
    PtyRequest,
    Runtime,
    SkillMount,
)
from shellbox.sandbox.remote import RemoteRuntime


@pytest.fixture(params=["local", "node"])
async def rt(request: pytest.FixtureRequest, oci: OciRuntime) -> AsyncIterator[Runtime]:
    if request.param == "local":
        yield oci  # seen through the protocol only (mypy checks the driver is a Runtime)
        return
    node = request.getfixturevalue("node")
    remote = RemoteRuntime(node.url, node.key)
    yield remote
    await remote.aclose()


@pytest.fixture
async def box(rt: Runtime) -> AsyncIterator[str]:
    """A started container of the runtime under test, destroyed after the test."""
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    yield cid
    await rt.destroy(cid)


async def sh(rt: Runtime, cid: str, command: str) -> str:
    [result] = await rt.run(cid, ExecRequest([command], 10_000, 100_000))
    assert result.outcome.exit_code == 0, result.stderr
    return result.stdout


async def read_all(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in chunks])


async def body(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


# -- lifecycle ------------------------------------------------------------------------------


async def test_lifecycle_create_start_stop_destroy(rt: Runtime) -> None:
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    try:
        assert await rt.state(cid) == "absent"  # laid out, not started
        assert cid in {i.id for i in await rt.list()}
        await rt.start(cid)
        assert await rt.state(cid) == "running"
        assert await rt.responsive(cid)
        await rt.write_file(cid, "kept.txt", [b"kept"])
        await rt.stop(cid)
        assert await rt.state(cid) == "absent"
        assert not await rt.responsive(cid)
        # A stopped container's files are still there, and it starts again with them.
        assert await read_all(await rt.read_file(cid, "kept.txt")) == b"kept"
        await rt.start(cid)
        assert await sh(rt, cid, "cat /mnt/data/kept.txt") == "kept"
    finally:
        await rt.destroy(cid)
    assert cid not in {i.id for i in await rt.list()}
    await rt.destroy(cid)  # idempotent


async def test_pause_freezes_and_resume_thaws(rt: Runtime, box: str) -> None:
    await rt.pause(box)
    assert await rt.state(box) == "paused"
    await rt.resume(box)
    assert await rt.state(box) == "running"
    assert await sh(rt, box, "echo thawed") == "thawed\n"


async def test_update_applies_env_to_the_next_command(rt: Runtime, box: str) -> None:
    await rt.update(ContainerSpec(id=box, env={"CONTRACT_VAR": "updated"}))
    assert await sh(rt, box, "echo $CONTRACT_VAR") == "updated\n"


async def test_update_applies_a_smaller_disk_limit_at_once(rt: Runtime, box: str) -> None:
    await rt.update(ContainerSpec(id=box, disk_limit_bytes=64 << 20))
    [result] = await rt.run(
        box,
        ExecRequest(["head -c 100000000 /dev/zero > /mnt/data/big"], 30_000, 1000),
    )
    assert result.outcome.exit_code != 0
    assert "quota" in result.stderr.lower() or "space" in result.stderr.lower()


async def test_recover_adopts_a_running_container(rt: Runtime, box: str) -> None:
    await sh(rt, box, "echo alive > /tmp/mark")
    done = await rt.recover()
    assert done[box] == "adopted"
    assert await sh(rt, box, "cat /tmp/mark") == "alive\n"  # the same processes and /tmp


async def test_describe_and_image_file(rt: Runtime) -> None:
    info = rt.describe()
    assert info.image_id.startswith(f"{info.image_profile}-")
    assert info.cgroup in ("v2", "hybrid", "v1")
    os_release = await rt.image_file("/etc/os-release")
    assert os_release is not None and b"ID=" in os_release
    assert await rt.image_file("/no/such/file") is None


# -- commands -------------------------------------------------------------------------------


async def test_exec_streams_events_and_run_collects_results(rt: Runtime, box: str) -> None:
    events = [e async for e in rt.exec(box, ExecRequest(["echo out; echo err >&2"], 10_000, 100))]
    assert isinstance(events[0], CommandStarted)
    deltas = {(e.stream, e.text) for e in events if isinstance(e, OutputDelta)}
    assert deltas == {("stdout", "out\n"), ("stderr", "err\n")}
    assert isinstance(events[-1], CommandFinished) and events[-1].result.outcome.exit_code == 0
    results = await rt.run(box, ExecRequest(["exit 4", "echo two"], 10_000, 100))
    assert [r.outcome.exit_code for r in results] == [4, 0]


async def test_pty_is_a_terminal_that_ends_with_its_shell(rt: Runtime, box: str) -> None:
    term = await rt.pty(box, PtyRequest(cols=91, rows=17))
    output = term.output()
    seen = b""

    async def until(pattern: bytes) -> bytes:
        nonlocal seen
        while not re.search(pattern, seen):
            seen += await asyncio.wait_for(anext(output), 10)
        found, seen = seen, b""
        return found

    try:
        await term.write(b"tty; stty size; id -u; pwd; echo =done\n")
        first = await until(rb"\n=done")
        await term.resize(100, 30)
        await term.write(b"stty size; exit 3\n")
        rest = b"".join([chunk async for chunk in output])
    finally:
        await term.close()
    assert re.search(rb"/dev/pts/\d+\r\n17 91\r\n1000\r\n/mnt/data\r\n", first), first
    assert re.search(rb"[\r\n]30 100\r\n", rest), rest
    assert term.exit_code == 3


# -- files ----------------------------------------------------------------------------------


async def test_write_read_stat_list_remove(rt: Runtime, box: str) -> None:
    where, size = await rt.write_file(box, "dir/sub/a.txt", body(b"hello ", b"world"))
    assert (where, size) == ("dir/sub/a.txt", 11)
    # Written as the sandbox user, visible inside at once.
    assert await sh(rt, box, "stat -c '%u %g' /mnt/data/dir/sub/a.txt") == "1000 1000\n"
    assert await sh(rt, box, "cat /mnt/data/dir/sub/a.txt") == "hello world"
    assert await read_all(await rt.read_file(box, "dir/sub/a.txt")) == b"hello world"
    info = await rt.stat_file(box, "dir/sub/a.txt")
    assert info is not None and (info.path, info.size) == ("dir/sub/a.txt", 11)
    assert await rt.stat_file(box, "dir/sub") is None  # a directory is not a file
    await sh(rt, box, "echo made > /mnt/data/inside.txt")
    listed = {f.path: f for f in await rt.list_files(box)}
    assert set(listed) == {"dir/sub/a.txt", "inside.txt"}
    assert listed["dir/sub/a.txt"] == info
    assert isinstance(listed["inside.txt"], FileInfo) and listed["inside.txt"].size == 5
    await rt.remove_file(box, "dir/sub/a.txt")
    assert await rt.stat_file(box, "dir/sub/a.txt") is None
    with pytest.raises(FileNotFound):
        await rt.remove_file(box, "dir/sub/a.txt")
    with pytest.raises(FileNotFound):
        await rt.read_file(box, "dir/sub/a.txt")  # raised before any byte is streamed


async def test_write_takes_a_sync_body_and_a_failing_body_leaves_nothing(
    rt: Runtime, box: str
) -> None:
    def capped() -> Iterator[bytes]:
        yield b"x" * 1000
        raise PayloadTooLarge("too large", param="file")

    with pytest.raises(PayloadTooLarge):
        await rt.write_file(box, "new/half.bin", capped(), param="file")
    assert await rt.list_files(box) == []
    assert await sh(rt, box, "ls -A /mnt/data") == ""
    assert await rt.write_file(box, "whole.bin", iter([b"ab", b"cd"])) == ("whole.bin", 4)


async def test_links_are_refused_or_followed_only_inside(rt: Runtime, box: str) -> None:
    await sh(
        rt,
        box,
        "cd /mnt/data && echo real > real.txt && ln -s real.txt inside && "
        "ln -s /etc/passwd outside && mkdir d && ln -s ../real.txt d/up",
    )
    with pytest.raises(InvalidRequest):  # not followed by default
        await rt.read_file(box, "inside", param="file")
    data = await read_all(await rt.read_file(box, "inside", follow_links=True))
    assert data == b"real\n"
    assert await rt.resolve_path(box, "d/up") == "real.txt"
    assert await rt.resolve_path(box, "d/..") == ""
    with pytest.raises(PathOutsideWorkspace) as caught:
        await rt.read_file(box, "outside", follow_links=True, param="path")
    assert caught.value.param == "path"
    with pytest.raises(PathOutsideWorkspace):
        await rt.resolve_path(box, "outside")
    with pytest.raises(PathOutsideWorkspace):
        await rt.write_file(box, "outside", [b"evil"], follow_links=True)
    # Written through an inside link: the link's target changes, the link stays.
    assert await rt.write_file(box, "inside", [b"new"], follow_links=True) == ("real.txt", 3)
    assert await sh(rt, box, "readlink /mnt/data/inside; cat /mnt/data/real.txt") == (
        "real.txt\nnew"
    )
    listed = {f.path for f in await rt.list_files(box)}
    assert listed == {"real.txt"}  # links are not files


async def test_apply_patch_is_all_or_nothing(rt: Runtime, box: str) -> None:
    await rt.write_file(box, "code.py", [b"a = 1\nb = 2\n"])
    ok = await rt.apply_patch(
        box,
        parse_patch(
            "*** Begin Patch\n*** Update File: code.py\n@@\n a = 1\n-b = 2\n+b = 3\n"
            "*** Add File: new.txt\n+fresh\n*** End Patch"
        ),
    )
    assert ok.completed, ok.output
    assert await sh(rt, box, "cat /mnt/data/code.py /mnt/data/new.txt") == "a = 1\nb = 3\nfresh"
    assert await sh(rt, box, "stat -c %u /mnt/data/new.txt") == "1000\n"
    failed = await rt.apply_patch(
        box,
        parse_patch(
            "*** Begin Patch\n*** Add File: other.txt\n+x\n"
            "*** Update File: missing.py\n@@\n-a\n+b\n*** End Patch"
        ),
    )
    assert not failed.completed
    assert "missing.py" in failed.output
    assert await rt.stat_file(box, "other.txt") is None  # the first operation was not kept


async def test_archives_round_trip_inside_the_sandbox(rt: Runtime, box: str) -> None:
    await sh(rt, box, "mkdir -p /mnt/data/src/skip && echo one > /mnt/data/src/a.txt")
    await sh(rt, box, "echo no > /mnt/data/src/skip/b.txt")
    before = await sh(rt, box, "stat -c %Y /mnt/data")
    exported = await read_all(await rt.export_archive(box, "src", ["./skip"], timeout_ms=30_000))
    assert await sh(rt, box, "stat -c %Y /mnt/data") == before  # the tree is unchanged
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        names = tar.getnames()
    assert "./a.txt" in names and not any("skip" in n for n in names)
    size = await rt.import_archive(box, "copy/here", body(exported), timeout_ms=30_000)
    assert size == len(exported)
    assert await sh(rt, box, "cat /mnt/data/copy/here/a.txt") == "one\n"
    assert {f.path for f in await rt.list_files(box)} == {
        "src/a.txt",
        "src/skip/b.txt",
        "copy/here/a.txt",
    }  # no temporary archive is left or listed
    with pytest.raises(FileNotFound):
        await rt.export_archive(box, "no/such/dir", [], timeout_ms=30_000)
    with pytest.raises(InvalidRequest):
        await rt.import_archive(box, "", body(b"not a tar" * 100), timeout_ms=30_000)


async def test_sweep_uploads_keeps_the_sandbox_files(rt: Runtime, box: str) -> None:
    # A file the sandbox made with the temporaries' prefix is the sandbox's, never swept.
    await sh(rt, box, "echo mine > /mnt/data/.shellbox-upload-000000000000-1")
    assert await rt.sweep_uploads(box) == 0
    assert await sh(rt, box, "cat /mnt/data/.shellbox-upload-000000000000-1") == "mine\n"


# -- snapshots ------------------------------------------------------------------------------


async def test_snapshot_fork_and_delete(rt: Runtime, box: str) -> None:
    await rt.write_file(box, "state.txt", [b"before"])
    snap = new_id("snap_")
    taken = await rt.snapshot(box, snap)
    assert taken.bytes > 0
    assert taken.frozen_s >= 0
    assert snap in await rt.snapshot_ids()
    await rt.write_file(box, "state.txt", [b"after"])  # the snapshot keeps what it saw
    fork = new_id("cntr_")
    await rt.fork(ContainerSpec(id=fork), snap)
    try:
        await rt.start(fork)
        assert await sh(rt, fork, "cat /mnt/data/state.txt") == "before"
        await rt.write_file(fork, "state.txt", [b"fork"])  # and a fork is its own
        assert await read_all(await rt.read_file(box, "state.txt")) == b"after"
        await rt.delete_snapshot(snap)
        assert snap not in await rt.snapshot_ids()
        await rt.delete_snapshot(snap)  # idempotent
        # The fork outlives its snapshot, with its files.
        assert await sh(rt, fork, "cat /mnt/data/state.txt") == "fork"
    finally:
        await rt.destroy(fork)


# -- skills and files, by value ---------------------------------------------------------------


def skill_tar(files: dict[str, bytes], *, executable: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            info.mode = 0o755 if name == executable else 0o600  # made readable by the runtime
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_skills_and_files_are_mounted_read_only_by_value(rt: Runtime) -> None:
    key = f"skill_{new_id('t')}.1"
    archive = skill_tar({"SKILL.md": b"# contract\n", "bin/run.sh": b"echo ran\n"},
                        executable="bin/run.sh")  # fmt: skip
    assert await rt.install_skill(key, body(archive))
    assert key in await rt.skill_keys()

    def never_read() -> Iterator[bytes]:
        raise AssertionError("a key already held must not read its archive")
        yield b""

    assert not await rt.install_skill(key, never_read())  # idempotent, by key
    cid = new_id("cntr_")
    spec = ContainerSpec(
        id=cid,
        skills=(SkillMount(key, "/mnt/skills/contract"),),
        files={"/mnt/skills/index.json": '{"data": ["contract"]}\n'},
    )
    await rt.create(spec)
    try:
        await rt.start(cid)
        assert await sh(rt, cid, "cat /mnt/skills/contract/SKILL.md") == "# contract\n"
        assert await sh(rt, cid, "/mnt/skills/contract/bin/run.sh") == "ran\n"
        assert await sh(rt, cid, "cat /mnt/skills/index.json") == '{"data": ["contract"]}\n'
        [write] = await rt.run(
            cid,
            ExecRequest(
                ["touch /mnt/skills/contract/x || touch /mnt/skills/index.json"], 10_000, 1000
            ),
        )
        assert write.outcome.exit_code != 0  # read-only, both
    finally:
        await rt.destroy(cid)
    await rt.remove_skill(key)
    assert key not in await rt.skill_keys()
    await rt.remove_skill(key)  # idempotent


async def test_a_skill_archive_may_not_reach_outside(rt: Runtime) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    key = f"skill_{new_id('t')}.1"
    with pytest.raises(InvalidRequest):
        await rt.install_skill(key, [buf.getvalue()])
    assert key not in await rt.skill_keys()
    with pytest.raises(InvalidRequest):
        await rt.install_skill("../up", [b""])


# -- services inside --------------------------------------------------------------------------


async def test_connect_port_reaches_the_container_loopback(rt: Runtime, box: str) -> None:
    with pytest.raises(PortNotListening):
        await rt.connect_port(box, 8123)
    await sh(
        rt,
        box,
        "nohup python3 -c 'import socket; s = socket.socket(); "
        's.bind(("127.0.0.1", 8123)); s.listen(); c, _ = s.accept(); '
        "c.sendall(c.recv(100).upper())' >/dev/null 2>&1 &",
    )
    stream: ByteStream | None = None
    for _ in range(200):
        try:
            stream = await rt.connect_port(box, 8123)
            break
        except PortNotListening:
            await asyncio.sleep(0.05)
    assert stream is not None
    await stream.send(b"ping")
    assert await stream.receive() == b"PING"
    await stream.aclose()


async def test_memory_usage_is_what_the_container_holds(rt: Runtime, box: str) -> None:
    used = await rt.memory_usage(box)
    assert used is not None and 0 < used < 1 << 30


async def wait_for_port(rt: Runtime, cid: str, port: int) -> ByteStream:
    for _ in range(200):
        try:
            return await rt.connect_port(cid, port)
        except PortNotListening:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listened on {port}")


# A service that reads nothing until /tmp/go exists, then hashes what it reads up to the end
# (the caller's half-close) and answers with the digest and the count on the same socket.
SINK = r"""
import hashlib, os, socket, time
s = socket.socket(); s.bind(("127.0.0.1", 8124)); s.listen(); c, _ = s.accept()
while not os.path.exists("/tmp/go"): time.sleep(0.05)
h, n = hashlib.sha256(), 0
while data := c.recv(1 << 16): h.update(data); n += len(data)
c.sendall(f"{h.hexdigest()} {n}".encode()); c.close()
"""
# A service that sends 64 MiB, noting in /tmp/sent how much its socket has taken so far.
SOURCE = r"""
import socket
s = socket.socket(); s.bind(("127.0.0.1", 8125)); s.listen(); c, _ = s.accept()
block = bytes(range(256)) * 4096
for i in range(64):
    c.sendall(block)
    open("/tmp/sent", "w").write(str((i + 1) << 20))
c.close()
"""
TOTAL = 64 << 20


async def test_connect_port_holds_back_a_fast_writer_and_delivers_all(
    rt: Runtime, box: str
) -> None:
    await rt.write_file(box, "sink.py", [SINK.encode()])
    await sh(rt, box, "nohup python3 /mnt/data/sink.py >/dev/null 2>&1 &")
    stream = await wait_for_port(rt, box, 8124)
    block = bytes(range(256)) * 4096
    sent = 0

    async def send_all() -> None:
        nonlocal sent
        for _ in range(TOTAL // len(block)):
            await stream.send(block)
            sent += len(block)

    try:
        sender = asyncio.create_task(send_all())
        await asyncio.sleep(3)
        # The service reads nothing yet: what the way between buffers is bounded, and the
        # writer waits instead of queueing the rest.
        assert not sender.done() and sent < TOTAL // 2, sent
        await sh(rt, box, "touch /tmp/go")
        await asyncio.wait_for(sender, 120)
        await stream.send_eof()  # half-closed: the service sees its end and still answers
        answer = b""
        with pytest.raises(EndOfStream):
            while True:
                answer += await asyncio.wait_for(stream.receive(), 60)
    finally:
        await stream.aclose()
    digest = hashlib.sha256(block * (TOTAL // len(block))).hexdigest()
    assert answer.decode() == f"{digest} {TOTAL}"
    with pytest.raises(ClosedResourceError):
        await stream.receive()


async def test_connect_port_holds_back_a_fast_service_and_delivers_all(
    rt: Runtime, box: str
) -> None:
    await rt.write_file(box, "source.py", [SOURCE.encode()])
    await sh(rt, box, "nohup python3 /mnt/data/source.py >/dev/null 2>&1 &")
    stream = await wait_for_port(rt, box, 8125)
    try:
        await asyncio.sleep(3)  # nothing read: the service must be held back
        taken = int(await sh(rt, box, "cat /tmp/sent 2>/dev/null || echo 0"))
        assert taken < TOTAL // 2, taken
        received = hashlib.sha256()
        size = 0
        with pytest.raises(EndOfStream):
            while True:
                chunk = await asyncio.wait_for(stream.receive(), 60)
                received.update(chunk)
                size += len(chunk)
    finally:
        await stream.aclose()
    assert size == TOTAL
    assert received.hexdigest() == hashlib.sha256(bytes(range(256)) * 4096 * 64).hexdigest()


async def test_streams_of_a_container_that_is_not_there_fail_before_they_open(
    rt: Runtime,
) -> None:
    with pytest.raises(ContainerNotFound):
        await rt.connect_port("cntr_nosuchcontainer", 8000)
    with pytest.raises(ContainerNotFound):
        await rt.pty("cntr_nosuchcontainer", PtyRequest(cols=80, rows=24))
    assert await rt.memory_usage("cntr_nosuchcontainer") is None
