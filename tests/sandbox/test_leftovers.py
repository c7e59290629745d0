"""What a command that exits normally may leave running: a service stays, a runaway that
holds the process limit is killed (the rule is in the README's contract paragraph)."""

from __future__ import annotations

import time

from sandbox_helpers import run1

from shellbox.sandbox import ExecRequest, OciRuntime

BOMB = "f() { f | f & }; f"  # returns at once; its processes fork until the pids limit


def container_tasks(cid: str) -> int:
    from shellbox.sandbox.cgroups import CgroupMode, detect_mode

    v2 = detect_mode() is CgroupMode.v2
    path = f"/sys/fs/cgroup/shellbox/{cid}" if v2 else f"/sys/fs/cgroup/pids/shellbox/{cid}"
    with open(path + "/pids.current") as f:
        return int(f.read())


async def test_a_fork_bomb_that_returns_is_killed_and_the_next_call_runs_at_once(
    runtime: OciRuntime, container: str
) -> None:
    [bomb] = await runtime.run(container, ExecRequest([BOMB], 20_000, 4096))
    t = time.monotonic()
    [after] = await runtime.run(
        container, ExecRequest(["echo ok; ps -e --no-headers | wc -l"], 5_000, 4096)
    )
    elapsed = time.monotonic() - t
    assert after.outcome.exit_code == 0, after
    assert after.stdout.startswith("ok\n")
    assert int(after.stdout.split()[1]) < 20  # the agent, this shell, ps and wc
    assert elapsed < 1.0, elapsed
    # The kill is said where it happened: at the bomb's end (usually), or before the next
    # command started (when the bomb was still growing as it ended).
    note = bomb.stderr + after.stderr
    assert "left running: processes left by finished commands may hold at most half" in note
    assert container_tasks(container) < 20


async def test_a_service_of_a_few_processes_survives_a_runaway_being_killed(
    runtime: OciRuntime, container: str, marker: str
) -> None:
    start = f"for i in 1 2 3 4 5; do setsid sleep {marker} > /dev/null 2>&1 & done; echo started"
    assert (await run1(runtime, container, start)).stdout == "started\n"
    [bomb, after] = await runtime.run(
        container, ExecRequest([BOMB, f"pgrep -fc 'sleep {marker}'"], 20_000, 4096)
    )
    assert after.stdout == "5\n", (bomb, after)
    assert "killed the" in bomb.stderr + after.stderr
    # And the service alone is left alone by later calls.
    assert (await run1(runtime, container, f"pgrep -fc 'sleep {marker}'")).stdout == "5\n"
