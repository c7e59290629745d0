"""CPU (and, where the disk's scheduler has them, I/O) weights: tenants together weigh less
than the server, and every container the same."""

from __future__ import annotations

from pathlib import Path

from shellbox.sandbox import OciRuntime
from shellbox.sandbox.cgroups import (
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
