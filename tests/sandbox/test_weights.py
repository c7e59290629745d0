"""CPU (and, where the disk's scheduler has them, I/O) weights: tenants together weigh less
than the server, every container the same, and in each the agent more than its commands."""

from __future__ import annotations

from pathlib import Path

from sandbox_helpers import run1

from shellbox.sandbox import OciRuntime
from shellbox.sandbox.cgroups import (
    COMMANDS_CPU_SHARES,
    COMMANDS_CPU_WEIGHT,
    CONTAINER_CPU_SHARES,
    CONTAINER_CPU_WEIGHT,
    PARENT_CPU_SHARES,
    PARENT_CPU_WEIGHT,
    CgroupMode,
)


def test_containers_weigh_less_than_the_server_and_the_same_as_each_other(
    runtime: OciRuntime, container: str
) -> None:
    cg = runtime.cgroups
    if cg.mode is CgroupMode.v2:
        parent, name = cg.root / "shellbox", "cpu.weight"
        expected = (PARENT_CPU_WEIGHT, CONTAINER_CPU_WEIGHT)
    else:
        parent, name = cg.root / "cpu" / "shellbox", "cpu.shares"
        expected = (PARENT_CPU_SHARES, CONTAINER_CPU_SHARES)
    assert (int((parent / name).read_text()), int((parent / container / name).read_text())) == (
        expected
    )
    # The server's own processes (this test's, here) stay outside, where one weighs 1024/100.
    mine = Path("/proc/self/cgroup").read_text()
    assert "/shellbox" not in mine
    # The container's processes are in its weighted cgroup.
    # (On v2 the agent and the commands live in leaves below it: no internal processes.)
    procs = [
        pid for f in (parent / container).rglob("cgroup.procs") for pid in f.read_text().split()
    ]
    assert procs, "the container's agent is not in its cpu cgroup"
    # I/O weights, wherever this host's scheduler offers them.
    for io in ("blkio.bfq.weight", "blkio.weight", "io.bfq.weight"):
        for path in (cg.root / "blkio" / "shellbox" / container / io, parent / container / io):
            if path.exists():
                assert path.read_text().split()[-1] == "100", path


async def test_the_agent_weighs_more_than_its_commands(runtime: OciRuntime, container: str) -> None:
    """Inside a container the commands share a cpu cgroup weighing an eighth of the agent:
    whatever they run, the agent answers, kills and reaps ahead of them."""
    cg = runtime.cgroups
    r = await run1(runtime, container, "cat /proc/self/cgroup; sleep 0.3; cat /proc/1/cgroup")
    lines = r.stdout.splitlines()
    half = len(lines) // 2
    mine, agent = _cpu_path(lines[:half]), _cpu_path(lines[half:])
    if cg.mode is CgroupMode.v2:
        top = cg.root / "shellbox" / container
        assert "cpu" in (top / "cgroup.subtree_control").read_text().split()
        assert int((top / "cmds" / "cpu.weight").read_text()) == COMMANDS_CPU_WEIGHT
        assert int((top / "agent" / "cpu.weight").read_text()) == 100
        assert mine.startswith("/cmds/") and agent == "/agent", (mine, agent)
        return
    top = cg.root / "cpu" / "shellbox" / container
    assert int((top / "cmds" / "cpu.shares").read_text()) == COMMANDS_CPU_SHARES
    assert (mine, agent) == ("/cmds", "/")
    # The weight is root's: the container's root cannot raise it.
    assert (top / "cmds" / "cpu.shares").stat().st_uid == 0


def _cpu_path(lines: list[str]) -> str:
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers or "cpu" in controllers.split(","):
            return path
    raise AssertionError(lines)
