"""Recovery: the process that owns the containers (whatever holds the ``OciRuntime``) dies
uncleanly, a new one starts on the same state directory and takes everything back; and
``destroy`` leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sandbox_helpers import IMAGE_DIR, REPO, WAIT_S, host_pids, run1, wait_gone

from shellbox.agent import protocol
from shellbox.errors import AgentUnavailable
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, OciRuntime, PtyRequest, create_runtime
from shellbox.sandbox.crun import AGENT_FILES
from shellbox.settings import Settings

# The last commit whose agent spoke protocol 1 (commands inside the JSON header).
PROTOCOL_1_AGENT = Path(__file__).resolve().parent / "agent_protocol_1"

SERVICE = (
    "python3 -m http.server 8421 --bind 127.0.0.1 >/dev/null 2>&1 & "
    "for i in $(seq 100); do curl -s -o /dev/null 127.0.0.1:8421 && break; sleep 0.05; done"
)
OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from shellbox.sandbox import ContainerSpec, ExecRequest, create_runtime
    from shellbox.settings import Settings

    async def main() -> None:
        state, image, cid, service = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
        rt = create_runtime(Settings(state_dir=state, runtime={"image_dir": image}))
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)
        await rt.run(cid, ExecRequest(["echo kept > /mnt/data/file.txt", service], 20000, 100))
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def runtime_on(state: Path) -> OciRuntime:
    return create_runtime(Settings(state_dir=state, runtime={"image_dir": IMAGE_DIR}))


def leftovers(rt: OciRuntime, cid: str) -> list[str]:
    """Everything of a container that may outlive it on the host."""
    root = Path("/sys/fs/cgroup")  # v1 and hybrid: one tree per controller; v2: one tree
    found = [str(p) for p in [*root.glob(f"*/shellbox/{cid}"), *root.glob(f"shellbox/{cid}")]]
    for ns in ("self", "1"):  # this process's mount namespace, and the host's
        with open(f"/proc/{ns}/mountinfo") as f:
            found += [line for line in f if cid in line]
    for path in (rt.socket_dir(cid), rt.oci_root / cid, rt.container_dir(cid), rt.disk_dir(cid)):
        if path.exists():
            found.append(str(path))
    return found


async def test_an_unclean_death_of_the_owner_loses_nothing(host_state_dir: Path) -> None:
    cid = new_id("cntr_")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(host_state_dir), str(IMAGE_DIR), cid, SERVICE],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == "ready\n"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    rt = runtime_on(host_state_dir)  # a new owner, on the same state directory
    try:
        assert [(i.id, i.state) for i in await rt.list()] == [(cid, "running")]
        assert await rt.recover() == {cid: "adopted"}
        probe = "cat file.txt; curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:8421"
        r = await run1(rt, cid, probe)
        assert r.stdout == "kept\n200"  # the files, and the service started before the crash
    finally:
        await rt.destroy(cid)
    assert leftovers(rt, cid) == []


async def test_a_container_that_died_with_its_owner_is_restarted_with_its_files(
    host_state_dir: Path,
) -> None:
    rt = runtime_on(host_state_dir)
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    try:
        await run1(rt, cid, "mkdir -p deep/er && echo kept > deep/er/file.txt")
        pid = await rt.agent_pid(cid)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the container dies (a reboot would lose it entirely)
        for _ in range(100):
            if await rt.state(cid) != "running":
                break
            await asyncio.sleep(0.02)
        assert await rt.state(cid) == "stopped"
        fresh = runtime_on(host_state_dir)
        assert await fresh.recover() == {cid: "restarted"}
        r = await run1(fresh, cid, "cat deep/er/file.txt")
        assert r.stdout == "kept\n"
        assert await fresh.recover() == {cid: "adopted"}  # idempotent
    finally:
        await rt.destroy(cid)
    assert leftovers(rt, cid) == []


def install_protocol_1_agent(state: Path) -> Path:
    """The agent an older shellbox (protocol 1, commit faf5867) installed: a verbatim copy
    kept as test data in ``agent_protocol_1/``."""
    target = state / "agent" / "protocol-1"
    target.mkdir(parents=True)
    for name in AGENT_FILES:
        shutil.copyfile(PROTOCOL_1_AGENT / name, target / name)
        (target / name).chmod(0o644)
    target.chmod(0o755)
    target.parent.chmod(0o755)
    return target


async def agent_version(rt: OciRuntime, cid: str) -> int:
    reader, writer = await asyncio.open_unix_connection(str(rt.socket_path(cid)))
    writer.write(b'{"op": "ping"}\n')
    answer = json.loads(await reader.readline())
    writer.close()
    return int(answer["version"])


async def test_containers_of_an_older_agent_protocol_are_restarted_after_an_upgrade(
    host_state_dir: Path,
) -> None:
    """Containers an older shellbox started keep running through the upgrade; their agent
    answers every call of the new protocol with an error. The new server starts them again
    (files kept) when it adopts them, or on the first call if it adopted them unasked."""
    before = runtime_on(host_state_dir)  # the shellbox before the upgrade: its agent
    before.agent_dir = install_protocol_1_agent(host_state_dir)
    recovered, called, term = new_id("cntr_"), new_id("cntr_"), new_id("cntr_")
    try:
        for cid in (recovered, called, term):
            await before.create(ContainerSpec(id=cid))
            with pytest.raises(AgentUnavailable, match="speaks protocol 1, not"):
                await before.start(cid)
            assert await agent_version(before, cid) == 1
            (before.data_dir(cid) / "file.txt").write_text("kept\n")
        after = runtime_on(host_state_dir)
        # Adopted without a check (as by a server that does not call recover): the first
        # call is refused by the old agent, which is then replaced and the call sent again.
        r = await run1(after, called, "cat file.txt")
        assert (r.stdout, r.outcome.exit_code) == ("kept\n", 0), r
        assert await agent_version(after, called) == protocol.PROTOCOL_VERSION
        # So is the first terminal: the old agent knows no terminals.
        terminal = await after.pty(term, PtyRequest(cols=80, rows=24, command="cat file.txt"))
        out = b"".join([chunk async for chunk in terminal.output()])
        assert (out, terminal.exit_code) == (b"kept\r\n", 0)
        await terminal.close()
        # recover() restarts the other one rather than adopt it.
        assert await after.recover() == {
            recovered: "restarted",
            called: "adopted",
            term: "adopted",
        }
        assert await agent_version(after, recovered) == protocol.PROTOCOL_VERSION
        r = await run1(after, recovered, "cat file.txt")
        assert r.stdout == "kept\n"
    finally:
        for cid in (recovered, called, term):
            await before.destroy(cid)


async def test_recovery_after_the_runtime_state_is_gone(host_state_dir: Path) -> None:
    """As after a reboot: /run is empty, only the disk is left."""
    rt = runtime_on(host_state_dir)
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    try:
        await run1(rt, cid, "echo kept > file.txt")
        await rt.stop(cid)
        shutil.rmtree(rt.socket_dir(cid))
        assert await rt.state(cid) == "absent"
        assert await runtime_on(host_state_dir).recover() == {cid: "restarted"}
        assert (await run1(rt, cid, "cat file.txt")).stdout == "kept\n"
    finally:
        await rt.destroy(cid)


async def test_paused_containers_stay_paused(host_state_dir: Path) -> None:
    rt = runtime_on(host_state_dir)
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    try:
        await rt.pause(cid)
        assert await runtime_on(host_state_dir).recover() == {cid: "paused"}
        assert await rt.state(cid) == "paused"
        await rt.resume(cid)
        assert (await run1(rt, cid, "echo back")).stdout == "back\n"
    finally:
        await rt.destroy(cid)
    assert leftovers(rt, cid) == []


async def test_destroy_leaves_no_cgroup_mount_or_socket(runtime: OciRuntime) -> None:
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid))
    await runtime.start(cid)
    await run1(runtime, cid, "sleep 1000 & echo x > /tmp/a && echo y > b")
    assert leftovers(runtime, cid)  # the probe sees a live container
    await runtime.destroy(cid)
    assert leftovers(runtime, cid) == []
    await runtime.destroy(cid)  # idempotent
    assert cid not in {i.id for i in await runtime.list()}


async def test_an_interrupted_destroy_is_swept_up(host_state_dir: Path) -> None:
    rt = runtime_on(host_state_dir)
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    shutil.rmtree(rt.container_dir(cid))  # the owner died half-way through destroy()
    assert await runtime_on(host_state_dir).sweep_orphans() == [cid]
    assert leftovers(rt, cid) == []


async def test_the_exec_fallback_when_the_agent_socket_is_gone(
    runtime: OciRuntime, container: str
) -> None:
    """``crun exec`` runs the call when the agent cannot be reached but the container runs;
    a timeout there kills what the command started, and only that."""
    kept, escaper = f"sleep 6161.{os.getpid()}", f"sleep 6262.{os.getpid()}"
    await run1(runtime, container, f"({kept} &)")
    runtime.socket_path(container).unlink()
    # The timeout must fall after the escapers started (/tmp/armed: this path keeps no output
    # of a timed-out command), however slow the host (the emulated guest, a loaded one):
    # 500 ms first, doubled until a run gets that far.
    command = f"setsid {escaper} & ({escaper} &); touch /tmp/armed; sleep 3600"
    timeout_ms = 500
    while True:
        [timed_out] = await runtime.run(container, ExecRequest([command], timeout_ms, 100))
        assert timed_out.outcome.type == "timeout"
        armed = await run1(runtime, container, "test -e /tmp/armed && echo yes")
        if armed.stdout == "yes\n" or timeout_ms > WAIT_S * 1000:
            break
        timeout_ms *= 2
    assert armed.stdout == "yes\n", "the command never got as far as its escapers"
    assert await wait_gone(escaper) == []  # the setsid one and the double-forked one
    assert len(host_pids(kept)) == 1  # what ran before the call is left alone
    results = await runtime.run(container, ExecRequest(["id -u; pwd", "exit 4"], 10_000, 100))
    assert [(r.stdout, r.outcome.exit_code) for r in results] == [("1000\n/mnt/data\n", 0), ("", 4)]
    # A command of 1 MiB travels on stdin, not as argv; the command's own stdin is /dev/null.
    big = "cat; echo big; exit\n#" + "x" * ((1 << 20) - 21)
    [r] = await runtime.run(container, ExecRequest([big], 10_000, 100))
    assert (r.stdout, r.stderr, r.outcome.exit_code) == ("big\n", "", 0)
    await runtime.start(container)  # the agent does not answer: the container is restarted
    assert (await run1(runtime, container, "echo agent")).stdout == "agent\n"
