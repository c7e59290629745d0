"""Volatile /run/shellbox/<key> directories of vanished state directories are swept, with the
cgroups of the dead containers they record; nothing else that lives in /run/shellbox is, and
no cgroup a process still holds."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from shellbox.sandbox.cgroups import HostCgroups, detect_mode
from shellbox.sandbox.crun import OWNER_FILE, sweep_stale_run_dirs


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def test_sweep_removes_only_dirs_of_missing_owners_and_their_dead_containers(
    tmp_path: Path,
) -> None:
    cgroups = HostCgroups(detect_mode())
    base = tmp_path / "run"
    alive_owner = tmp_path / "state-alive"
    alive_owner.mkdir()
    names = ("owned", "orphan", "dead", "running", "legacy", "legacy-oci", "self")
    dirs = {name: base / key(name) for name in names}
    for d in dirs.values():
        (d / "crun").mkdir(parents=True)
        (d / "sock").mkdir()
    for name in ("orphan", "dead", "running", "self"):
        (dirs[name] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    (dirs["owned"] / OWNER_FILE).write_text(str(alive_owner))
    # Containers the OCI runtime still records, with their cgroups: one holds a process.
    suffix = f"{os.getpid()}{tmp_path.name[-6:]}".replace("_", "")
    dead, running, unowned = (f"cntr_{n}{suffix}" for n in ("dead", "run", "legacy"))
    for name, cid in (("dead", dead), ("running", running), ("legacy-oci", unowned)):
        (dirs[name] / "crun" / cid).mkdir()
        cgroups.prepare(cid, os.getuid())
    # The egress slot claims of every server on the host live here too: never swept (they
    # once were, and a restarted server then handed a live container's namespace out again).
    slots = base / "egress-slots"
    slots.mkdir()
    (slots / "1").write_text("owner\n")
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        procs = cgroups.container_dir(running, "pids") / "cgroup.procs"
        procs.write_text(str(sleeper.pid))

        removed = sweep_stale_run_dirs(base, cgroups, keep=dirs["self"])

        assert sorted(removed) == sorted([dirs["legacy"], dirs["orphan"], dirs["dead"]])
        left = {p.name for p in base.iterdir()}
        kept = ("owned", "running", "legacy-oci", "self")
        assert left == {*(key(n) for n in kept), "egress-slots"}
        assert (slots / "1").read_text() == "owner\n"
        assert not cgroups.container_dir(dead, "memory").exists()
        assert sleeper.poll() is None  # a process still there: nothing killed, nothing removed
        assert cgroups.container_dir(running, "memory").is_dir()
        assert cgroups.container_dir(unowned, "memory").is_dir()  # whose, nobody recorded
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
        for cid in (dead, running, unowned):
            cgroups.remove(cid)
