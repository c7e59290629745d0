"""The cgroup layout of the host, and the per-command cgroups the agent makes in its delegated
subtree, on whichever layout this host has (hybrid here; pure v2 in ``scripts/test-v2.sh``).

``SHELLBOX_EXPECT_CGROUP`` (v1, v2, hybrid) makes a lane fail when the layout is not the one it
was booted for, so the v2 lane can never pass by running on something else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sandbox_helpers import WAIT_S, run1

from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, OciRuntime
from shellbox.sandbox.cgroups import CgroupMode, detect_mode


def _mounted_layout() -> CgroupMode:
    """The layout as the host's mount table tells it (PID 1's: this process may be in a
    private mount namespace where a tmpfs hides the hybrid cgroup2 mount)."""
    with open("/proc/1/mounts") as f:
        mounts = {line.split()[1]: line.split()[2] for line in f if line.strip()}
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        return CgroupMode.v2
    if mounts.get("/sys/fs/cgroup/unified") == "cgroup2":
        return CgroupMode.hybrid
    return CgroupMode.v1


def test_the_layout_is_detected(runtime: OciRuntime) -> None:
    assert runtime.cgroups.mode is detect_mode() is _mounted_layout()
    expected = os.environ.get("SHELLBOX_EXPECT_CGROUP")
    if expected:
        assert runtime.cgroups.mode.value == expected


def test_detection_on_a_made_up_tree(tmp_path: Path) -> None:
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpu memory pids\n")
    assert detect_mode(tmp_path / "v2") is CgroupMode.v2
    (tmp_path / "v1" / "memory").mkdir(parents=True)
    assert detect_mode(tmp_path / "v1") is CgroupMode.v1  # nothing mounted at <root>/unified
    (tmp_path / "v1" / "unified").mkdir()
    assert detect_mode(tmp_path / "v1") is CgroupMode.v1


def _own_cgroups(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as controller -> path (v2's single line is under "")."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name.removeprefix("name=")] = path
    return out


async def test_each_command_runs_in_its_own_cgroup_apart_from_the_agent(
    runtime: OciRuntime, container: str
) -> None:
    # Two commands at once (two calls): each in a cgroup of its own.
    both = "cat /proc/self/cgroup; sleep 0.5"
    one, two = (
        _own_cgroups(r.stdout)
        for r in await asyncio.gather(
            run1(runtime, container, both), run1(runtime, container, both)
        )
    )
    # The agent steps into a command's cgroups for the moment of its spawn (this command's
    # too), which a loaded host can stretch: look once it has stepped back, or after WAIT_S.
    wait = int(WAIT_S * 10)
    look = (
        f"for i in $(seq {wait}); do grep -q cmd /proc/1/cgroup || break; sleep 0.1; done; "
        "cat /proc/1/cgroup"
    )
    agent = _own_cgroups((await run1(runtime, container, look, timeout_ms=wait * 200)).stdout)
    if runtime.cgroups.mode is CgroupMode.v2:
        # The agent in a leaf of its own, commands in leaves under the shared cmds/.
        assert agent == {"": "/agent"}
        assert one[""].startswith("/cmds/cmd-") and two[""].startswith("/cmds/cmd-")
        assert one[""] != two[""]
        return
    assert one["freezer"].startswith("/cmd-") and one["freezer"] != two["freezer"]
    assert one["pids"] == one["memory"] == "/cmds"
    assert agent["freezer"] == agent["pids"] == agent["memory"] == "/"


def _command_cgroup(text: str) -> str:
    groups = _own_cgroups("\n".join(line for line in text.splitlines() if line.count(":") >= 2))
    return groups.get("freezer", groups.get("", ""))


async def test_command_cgroups_are_reused_not_made_for_each_command(
    runtime: OciRuntime, container: str
) -> None:
    """mkdir and rmdir of a cgroup wait for the kernel's global cgroup_mutex, which every
    container's cgroup work contends for: commands one after the other reuse a few cgroups."""
    seen = [
        _command_cgroup((await run1(runtime, container, "cat /proc/self/cgroup")).stdout)
        for _ in range(8)
    ]
    assert all("cmd-" in g for g in seen), seen
    assert len(set(seen)) <= 2, seen  # the spare's and the one a burst spawns into


async def test_a_cgroup_whose_command_was_killed_is_reused_empty_and_thawed(
    runtime: OciRuntime, container: str
) -> None:
    """A timeout freezes and kills a command's whole cgroup (escapers included); the cgroup
    then serves a later command, which runs, unfrozen, with nothing of the killed one left."""
    # The timeout must fall after the command has started its escapers ("armed"), however
    # slow the host (a loaded one, the emulated guest): a short one first, doubled until a
    # run gets that far. Each run that did not still timed out, and leaves nothing behind
    # that the check below would not also see.
    timeout_ms = 500
    while True:
        killed = await run1(
            runtime,
            container,
            "cat /proc/self/cgroup; (setsid sleep 3600 &); sleep 3600 & echo armed; sleep 3600",
            timeout_ms=timeout_ms,
        )
        assert killed.outcome.type == "timeout", killed
        if killed.stdout.endswith("armed\n") or timeout_ms > WAIT_S * 1000:
            break
        timeout_ms *= 2
    assert killed.stdout.endswith("armed\n"), killed
    group = _command_cgroup(killed.stdout)
    deadline = time.monotonic() + WAIT_S  # a kill on v2 is asynchronous: the agent sweeps later
    while True:
        r = await run1(
            runtime, container, "cat /proc/self/cgroup; pgrep -c sleep || true",
            timeout_ms=int(WAIT_S * 1000),
        )  # fmt: skip
        assert r.outcome.exit_code == 0, r
        if _command_cgroup(r.stdout) == group:
            break
        assert time.monotonic() < deadline, f"{group} was never reused"
        await asyncio.sleep(0.3)
    assert r.stdout.splitlines()[-1] == "0", r  # no sleep of the killed command survives


async def test_the_sandbox_user_cannot_raise_a_limit_or_leave_its_cgroup(
    runtime: OciRuntime, container: str
) -> None:
    if runtime.cgroups.mode is CgroupMode.v2:
        limits = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cmds/memory.max",
                  "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/cmds/pids.max"]  # fmt: skip
        homes = ["/sys/fs/cgroup/agent/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"]
    else:
        limits = ["/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/cmds/memory.limit_in_bytes",
                  "/sys/fs/cgroup/pids/cmds/pids.max"]  # fmt: skip
        homes = ["/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/memory/cgroup.procs"]
    tries = [f"echo max > {p} && echo RAISED {p}" for p in limits]
    tries += [f"echo $$ > {p} && echo MOVED {p}" for p in homes]
    r = await run1(runtime, container, "; ".join(tries))
    assert "RAISED" not in r.stdout and "MOVED" not in r.stdout, r


async def test_host_side_delegation_keeps_the_limits_root_owned(
    runtime: OciRuntime, container: str
) -> None:
    v2 = runtime.cgroups.mode is CgroupMode.v2
    top = runtime.cgroups.container_dir(container, "memory")
    container_root = top.stat().st_uid
    assert container_root != 0
    if v2:
        delegated = ["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"]
        kept = ["memory.max", "pids.max", "cpu.max", "cgroup.freeze", "cgroup.kill"]
        limit = top / "memory.max"
    else:
        delegated = ["cgroup.procs", "tasks"]
        kept = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
        limit = top / "memory.limit_in_bytes"
    for name in delegated:
        assert (top / name).stat().st_uid == container_root, name
    for name in kept:
        if (top / name).exists():  # memsw needs swap accounting
            assert (top / name).stat().st_uid == 0, name
    assert int(limit.read_text()) == 1 << 30
    cpu = runtime.cgroups.container_dir(container, "cpu")
    if v2:
        assert set((top / "cgroup.subtree_control").read_text().split()) >= {"memory", "pids"}
        assert (cpu / "cpu.max").read_text().split() == ["100000", "100000"]  # one core
        assert (top / "pids.max").read_text().strip() == "1024"
    else:
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "100000"
        pids = runtime.cgroups.container_dir(container, "pids") / "pids.max"
        assert pids.read_text().strip() == "1024"


async def test_the_exec_fallback_joins_the_commands_cgroup(oci: OciRuntime, box: str) -> None:
    """Without the agent, ``crun exec`` (``runc exec``) runs the command. On v2 the
    container's own cgroup cannot hold it (the agent enabled controllers there): it joins
    ``cmds/exec``, under the commands' limits."""
    oci.socket_path(box).unlink()
    [r] = await oci.run(box, ExecRequest(["cat /proc/self/cgroup"], 20_000, 4096))
    assert r.outcome.exit_code == 0, r
    if oci.cgroups.mode is CgroupMode.v2:
        assert _own_cgroups(r.stdout) == {"": "/cmds/exec"}
    else:
        assert _own_cgroups(r.stdout)["memory"] == "/"


async def test_memory_usage_is_read_from_the_container_cgroup(
    runtime: OciRuntime, container: str
) -> None:
    before = await runtime.memory_usage(container)
    await run1(runtime, container, "head -c 64M /dev/zero > /dev/shm/fill")
    after = await runtime.memory_usage(container)
    assert before is not None and after is not None
    assert after - before >= 60 << 20  # tmpfs pages are charged to the container


@pytest.mark.parametrize("frozen", [False, True], ids=["running", "frozen"])
def test_removal_kills_what_is_left_in_a_containers_cgroups(
    runtime: OciRuntime, frozen: bool
) -> None:
    """A process that outlived the runtime's kill (a terminal's shell in a sub-cgroup, slow to
    die on a loaded machine; or one that escaped it) must not make removing a container fail
    with EBUSY: removal kills what is left and then removes the tree. Frozen too: an agent
    killed between freezing a command's cgroup and thawing it leaves it frozen, and a frozen
    process ignores SIGKILL until it is thawed."""
    cgroups = runtime.cgroups
    cid = f"cntr_stray{os.getpid()}{'f' if frozen else 'r'}"
    cgroups.prepare(cid, os.getuid())
    v2 = cgroups.mode is CgroupMode.v2
    tops = cgroups._tops(cid)
    freezer = cgroups.container_dir(cid, "freezer")
    stray = subprocess.Popen(["sleep", "300"])
    try:
        for top in (t for t in tops if t.is_dir()):
            (top / "stray").mkdir(exist_ok=True)
            (top / "stray" / "cgroup.procs").write_text(str(stray.pid))
        if frozen:
            _freeze(freezer / "stray", v2)
        try:
            cgroups.remove(cid)
        except OSError as exc:
            pytest.fail(f"removing the cgroups of a container with a {frozen=} leftover: {exc!r}")
        assert stray.wait(timeout=WAIT_S) == -signal.SIGKILL
        assert not any(top.exists() for top in tops)
    finally:
        # Whatever happened: thaw the stray (a frozen one outlives SIGKILL, and waiting for
        # it would hang), end it, and leave no cgroup behind.
        _thaw_all(freezer, v2)
        stray.kill()
        stray.wait(timeout=10)
        for top in tops:
            for dirpath, _, _ in os.walk(top, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)


def _freeze(group: Path, v2: bool) -> None:
    """Freeze one cgroup from the host, and wait until the kernel says it is frozen."""
    (group / _FREEZE_CONTROL[v2]).write_text("1" if v2 else "FROZEN")
    deadline = time.monotonic() + WAIT_S
    while True:
        if v2 and "frozen 1" in (group / "cgroup.events").read_text():
            return
        if not v2 and (group / "freezer.state").read_text().strip() == "FROZEN":
            return
        assert time.monotonic() < deadline, f"{group} did not freeze"
        time.sleep(0.01)


def _thaw_all(top: Path, v2: bool) -> None:
    """Thaw every cgroup under ``top``: a test's clean-up, whatever it left frozen."""
    for state in top.rglob(_FREEZE_CONTROL[v2]) if top.is_dir() else []:
        with contextlib.suppress(OSError):
            state.write_text("0" if v2 else "THAWED")


_FREEZE_CONTROL = {True: "cgroup.freeze", False: "freezer.state"}


async def test_a_container_whose_command_cgroup_was_left_frozen_is_destroyed(
    runtime: OciRuntime,
) -> None:
    """The agent freezes a command's cgroup to kill it; killed itself before the thaw, it
    leaves that cgroup frozen, and its processes outlive every SIGKILL. Destroying the
    container still ends them and removes its cgroups."""
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid))
    await runtime.start(cid)
    v2 = runtime.cgroups.mode is CgroupMode.v2
    top = runtime.cgroups.container_dir(cid, "freezer")
    try:
        r = await run1(runtime, cid, "cat /proc/self/cgroup; (sleep 300 &)")
        group = top / _command_cgroup(r.stdout).lstrip("/")
        assert group != top and group.is_dir(), r
        _freeze(group, v2)
        try:
            await asyncio.wait_for(runtime.destroy(cid), 30)
        except OSError as exc:
            pytest.fail(f"destroying a container with a frozen command cgroup: {exc!r}")
        assert not top.exists()
    finally:
        _thaw_all(top, v2)
        await runtime.destroy(cid)
