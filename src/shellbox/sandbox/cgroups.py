"""The host's cgroup layout: which kind it is, and the per-container subtree we delegate.

Three layouts exist: pure v2 (Debian 12, Ubuntu 22.04+, Fedora, Kubernetes nodes), pure v1,
and *hybrid* (v1 controllers plus a v2 mount at ``/sys/fs/cgroup/unified`` holding nothing
useful). crun 1.8 refuses hybrid hosts, so on those every crun call runs in a private mount
namespace with the v2 mount removed, which makes crun use plain v1 (see ``crun.py``).

Each container's cgroup is ``shellbox/<id>``. Before the container starts we create it in the
controllers the in-container agent needs (memory, pids, freezer) and hand it to the
container's root uid, so the agent can make one sub-cgroup per command; uid 1000 inside can
neither move out of it nor raise a limit.

On v2 that hand-over is the kernel's delegation (``cgroup.procs``, ``cgroup.subtree_control``
and ``cgroup.threads`` owned by the delegatee); the limit files stay root's. The agent then
lives in ``agent/`` and the commands in ``cmds/cmd-N`` (v2 lets no cgroup with controllers
enabled for its children hold processes). The freezer is ``cgroup.freeze`` and a command's
whole tree dies by ``cgroup.kill``: nothing to mount or enable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from shellbox.errors import SandboxError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "shellbox"
DELEGATED_V1 = ("memory", "pids", "freezer")
V2_DELEGATED_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")
# CPU and I/O weights. All containers together weigh half of one process of the server's (which
# runs outside ``shellbox/``, as does the egress proxy), so the server keeps answering whatever
# tenants run; each container weighs the same, so one container's load cannot starve another's.
# v1 ``cpu.shares`` (default 1024) and v2 ``cpu.weight`` (default 100) say the same thing; I/O
# weights exist only where the disk's scheduler is BFQ (``blkio.bfq.weight``, ``io.bfq.weight``)
# or, on v2, with io.cost (``io.weight``), and are written where the files exist.
PARENT_CPU_SHARES, CONTAINER_CPU_SHARES = 512, 1024
PARENT_CPU_WEIGHT, CONTAINER_CPU_WEIGHT = 50, 100
PARENT_IO_WEIGHT, CONTAINER_IO_WEIGHT = 50, 100
# How often ``remove`` kills again what is left while the cgroups stay busy, in seconds.
KILL_REPEAT_S = 0.5
# Bounds for what only the kernel's pace decides, so for a stuck process only, never for the
# common case: killed processes leaving their cgroups (exiting a task with a big address space
# or the last one of a mount namespace, whose overlay is synced, can take tens of seconds on a
# loaded host), and every task reaching the freezer. Shorter bounds answered 500s under load.
REMOVE_TIMEOUT_S = 60.0
FREEZE_TIMEOUT_S = 30.0


class CgroupMode(StrEnum):
    v1 = "v1"
    v2 = "v2"
    hybrid = "hybrid"


def detect_mode(root: Path = CGROUP_ROOT) -> CgroupMode:
    if (root / "cgroup.controllers").exists():
        return CgroupMode.v2
    # A tmpfs there is hybrid too: the stand-in a shellbox process (this one, or the parent
    # whose mount namespace it inherited) put over the cgroup2 mount (``hostns``).
    if (root / "unified").is_dir() and _mount_type(root / "unified") in ("cgroup2", "tmpfs"):
        return CgroupMode.hybrid
    return CgroupMode.v1


def _mount_type(path: Path) -> str | None:
    """The filesystem type mounted at ``path`` (the topmost mount), or None."""
    target, found = str(path), None
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and fields[1] == target:
                found = fields[2]
    return found


@dataclass(frozen=True)
class HostCgroups:
    mode: CgroupMode
    root: Path = CGROUP_ROOT

    def describe(self) -> str:
        """The layout in words, for the start-up log."""
        return {
            CgroupMode.v2: "pure cgroup v2 (unified hierarchy, delegated subtrees)",
            CgroupMode.hybrid: "hybrid (cgroup v1 controllers, cgroup2 mount hidden from crun)",
            CgroupMode.v1: "cgroup v1",
        }[self.mode]

    def container_dir(self, container_id: str, controller: str = "memory") -> Path:
        """The directory of the container's cgroup holding ``controller``'s files (on v2 one
        directory holds them all)."""
        if self.mode is CgroupMode.v2:
            return self.root / PARENT / container_id
        return self.root / controller / PARENT / container_id

    def exec_cgroup(self, container_id: str) -> str | None:
        """The sub-cgroup an OCI ``exec`` must join, relative to the container's cgroup, or
        None for the container's own.

        On v2 a cgroup whose ``cgroup.subtree_control`` is not empty cannot take processes,
        and the agent enables memory and pids there: an exec then joins a leaf under
        ``cmds`` (created here), so it shares the commands' limits and spares the agent's
        memory, as a command run by the agent would.
        """
        if self.mode is not CgroupMode.v2:
            return None
        top = self.root / PARENT / container_id
        try:
            if not (top / "cgroup.subtree_control").read_text().split():
                return None
        except OSError:
            return None
        parent = top / "cmds" if (top / "cmds").is_dir() else top
        (parent / "exec").mkdir(exist_ok=True)
        return str((parent / "exec").relative_to(top))

    def cgroups_path(self, container_id: str) -> str:
        """The value for the OCI ``linux.cgroupsPath``."""
        return f"/{PARENT}/{container_id}"

    def _v1_hierarchies(self) -> list[Path]:
        out = []
        for entry in sorted(self.root.iterdir()):
            if entry.name == "unified" or not entry.is_dir() or entry.is_symlink():
                continue
            out.append(entry)
        return out

    def prepare(self, container_id: str, owner_uid: int) -> None:
        """Create the container's cgroup and delegate it to ``owner_uid``."""
        if self.mode is CgroupMode.v2:
            parent = self.root / PARENT
            parent.mkdir(exist_ok=True)
            _enable_v2_controllers(self.root)
            _enable_v2_controllers(parent)
            path = parent / container_id
            path.mkdir(exist_ok=True)
            os.chown(path, owner_uid, owner_uid)
            for name in V2_DELEGATED_FILES:
                if (path / name).exists():
                    os.chown(path / name, owner_uid, owner_uid)
            self.set_weights(container_id)
            return
        for ctl in DELEGATED_V1:
            path = self.root / ctl / PARENT / container_id
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, owner_uid, owner_uid)
            for name in ("cgroup.procs", "tasks"):
                os.chown(path / name, owner_uid, owner_uid)
        self.set_weights(container_id)

    def set_weights(self, container_id: str) -> None:
        """The CPU and I/O weights of ``shellbox/`` and of the container (see the constants)."""
        if self.mode is CgroupMode.v2:
            parent = self.root / PARENT
            cpu = ("cpu.weight", PARENT_CPU_WEIGHT, CONTAINER_CPU_WEIGHT)
            io = [(name, PARENT_IO_WEIGHT, CONTAINER_IO_WEIGHT) for name in V2_IO_WEIGHTS]
            places = [(parent, [cpu, *io])]
        else:
            cpu = ("cpu.shares", PARENT_CPU_SHARES, CONTAINER_CPU_SHARES)
            io = [(name, PARENT_IO_WEIGHT, CONTAINER_IO_WEIGHT) for name in V1_IO_WEIGHTS]
            places = [(self.root / "cpu" / PARENT, [cpu]), (self.root / "blkio" / PARENT, io)]
        for parent, files in places:
            if not parent.parent.is_dir():
                continue  # no such hierarchy here
            child = parent / container_id
            child.mkdir(parents=True, exist_ok=True)
            for name, parent_value, child_value in files:
                for path, value in ((parent, parent_value), (child, child_value)):
                    if (path / name).exists():
                        _write_weight(path / name, value)

    def remove(self, container_id: str, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
        """Remove the container's cgroups, sub-cgroups first. Waits for dying processes,
        and kills any still there (a runtime's kill reaches the container's own cgroup; on a
        loaded machine the processes of its sub-cgroups, terminals and commands, can take
        seconds to go, and one that escaped the kill must not make the removal fail).

        A frozen process ignores SIGKILL until it is thawed, and one can be left frozen: a
        paused container, or a command's cgroup the agent froze to kill it and was killed
        itself before thawing. So the kill thaws every cgroup of the tree after signalling
        (``_kill_everything``)."""
        tops = self._tops(container_id)
        deadline = time.monotonic() + timeout_s
        next_kill = 0.0  # again now and then: a process may have forked between two kills
        for top in tops:
            if not top.is_dir():
                continue
            while True:
                try:
                    _rmdir_tree(top)
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    if time.monotonic() >= next_kill:
                        self._kill_everything(tops)
                        next_kill = time.monotonic() + KILL_REPEAT_S
                    time.sleep(0.01)

    def remove_if_empty(self, container_id: str) -> bool:
        """Remove the container's cgroups if no process is left in them, killing nothing:
        the removal of a dead container's leftovers. False (and some kept) when a process
        is still there."""
        tops = [top for top in self._tops(container_id) if top.is_dir()]
        # Looked at in every hierarchy first: a process can sit in one and not another, and
        # a hierarchy's cgroup removed before the busy one is found would be gone for good.
        if any(_holds_processes(top) for top in tops):
            return False
        for top in tops:
            try:
                _rmdir_tree(top)
            except FileNotFoundError:
                pass  # removed meanwhile
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                return False
        return True

    def _tops(self, container_id: str) -> list[Path]:
        """The container's cgroup in every hierarchy (v1), or its one cgroup (v2)."""
        if self.mode is CgroupMode.v2:
            return [self.root / PARENT / container_id]
        return [h / PARENT / container_id for h in self._v1_hierarchies()]

    def _kill_everything(self, tops: list[Path]) -> None:
        """SIGKILL every process in the container's cgroups, then thaw them all so the kill
        lands. On v1 the tree is frozen first (nothing forks past the list; frozen and
        thawed together, a kill and a fork cannot race), and all hierarchies are signalled,
        not only the freezer's: a process can be in a sub-cgroup of one and not another."""
        if self.mode is CgroupMode.v2:
            _kill_tree(tops[0])
            # Fatal signals end v2-frozen processes (``cgroup.kill`` included); thawing as
            # well costs nothing and does not depend on that.
            _thaw_tree(tops[0], "cgroup.freeze", "0")
            return
        freezer = self.root / "freezer" / PARENT / tops[0].name
        with contextlib.suppress(FileNotFoundError):
            (freezer / "freezer.state").write_text("FROZEN")
            deadline = time.monotonic() + 1.0  # a process in the kernel can delay it
            while "FROZEN" not in (freezer / "freezer.state").read_text():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
        try:
            for top in tops:
                if top.is_dir():
                    _kill_tree(top)
        finally:
            _thaw_tree(freezer, "freezer.state", "THAWED")

    def memory_usage(self, container_id: str) -> int | None:
        """Bytes charged to the container's memory cgroup, or None without one."""
        name = "memory.current" if self.mode is CgroupMode.v2 else "memory.usage_in_bytes"
        path = self.container_dir(container_id, "memory") / name
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def pids(self, container_id: str) -> set[int]:
        """Host pids of every process in the container's cgroup and its sub-cgroups (the
        agent's per-command ones): where its processes are, wherever they daemonized to."""
        top = self.container_dir(container_id, "pids")
        found: set[int] = set()
        for dirpath, _, _ in os.walk(top):
            try:
                text = (Path(dirpath) / "cgroup.procs").read_text()
            except OSError:
                continue  # removed meanwhile
            found.update(int(pid) for pid in text.split())
        return found

    def freeze(self, container_id: str, frozen: bool, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
        """Freeze (or thaw) every process of the container, and return once the kernel says
        it is done: v2's ``cgroup.freeze``, v1's freezer. What ``crun pause`` does, without
        starting a process for it (~0.1 ms against ~10-40 ms), and what ``crun state``
        reads back as "paused"."""
        if self.mode is CgroupMode.v2:
            d = self.container_dir(container_id)
            (d / "cgroup.freeze").write_text("1" if frozen else "0")
            done, status = d / "cgroup.events", f"frozen {int(frozen)}"
        else:
            d = self.container_dir(container_id, "freezer")
            (d / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
            done, status = d / "freezer.state", "FROZEN" if frozen else "THAWED"
        deadline = time.monotonic() + timeout_s
        delay = 0.0001
        while status not in done.read_text():
            if time.monotonic() > deadline:
                msg = f"the cgroup of {container_id} did not reach {status!r} in {timeout_s} s"
                raise SandboxError(msg)
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def existing(self) -> set[str]:
        """Ids of containers that have a cgroup on this host."""
        v2 = self.mode is CgroupMode.v2
        parent = self.root / PARENT if v2 else self.root / "memory" / PARENT
        if not parent.is_dir():
            return set()
        return {p.name for p in parent.iterdir() if p.is_dir()}


V1_IO_WEIGHTS = ("blkio.bfq.weight", "blkio.weight")
V2_IO_WEIGHTS = ("io.bfq.weight", "io.weight")


def _write_weight(path: Path, value: int) -> None:
    """Write one weight; refused ones (io.weight without io.cost, say) are left as they are."""
    try:
        path.write_text(f"{value}\n" if not path.name.startswith("io.") else f"default {value}\n")
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENODEV):
            raise


def _enable_v2_controllers(path: Path) -> None:
    wanted = {"memory", "pids", "cpu", "io"}
    available = set((path / "cgroup.controllers").read_text().split())
    enabled = set((path / "cgroup.subtree_control").read_text().split())
    missing = (wanted & available) - enabled
    if missing:
        (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(missing)))


def _kill_tree(path: Path) -> None:
    """SIGKILL every process left in a cgroup tree (``cgroup.kill`` where the kernel has it)."""
    if (path / "cgroup.kill").exists():
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile: nothing to kill
            (path / "cgroup.kill").write_text("1")
        return
    for procs in path.rglob("cgroup.procs"):
        try:
            pids = procs.read_text().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _thaw_tree(path: Path, control: str, thawed: str) -> None:
    """Thaw every cgroup of a tree: a frozen descendant stays frozen when only its parent is
    thawed (v1 ``freezer.state``, v2 ``cgroup.freeze`` alike), so each one is written."""
    for state in path.rglob(control):  # the top's own file too
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            state.write_text(thawed)


def _holds_processes(path: Path) -> bool:
    """Whether any cgroup of a tree holds a process."""
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            if procs.read_text().strip():
                return True
    return False


def _rmdir_tree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir():
            _rmdir_tree(child)
    path.rmdir()
