"""Volatile /run/shellbox/<key> directories of vanished state directories are swept; nothing
else that lives in /run/shellbox is."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shellbox.sandbox.crun import OWNER_FILE, sweep_stale_run_dirs


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def test_sweep_removes_only_dirs_of_missing_owners_without_oci_state(tmp_path: Path) -> None:
    base = tmp_path / "run"
    alive_owner = tmp_path / "state-alive"
    alive_owner.mkdir()
    names = ("owned", "orphan", "running", "legacy", "self")
    dirs = {name: base / key(name) for name in names}
    for d in dirs.values():
        (d / "crun").mkdir(parents=True)
        (d / "sock").mkdir()
    (dirs["owned"] / OWNER_FILE).write_text(str(alive_owner))
    (dirs["orphan"] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    (dirs["running"] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    (dirs["running"] / "crun" / "cntr_x").mkdir()  # the OCI runtime still knows a container
    (dirs["self"] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    # The egress slot claims of every server on the host live here too: never swept (they
    # once were, and a restarted server then handed a live container's namespace out again).
    slots = base / "egress-slots"
    slots.mkdir()
    (slots / "1").write_text("owner\n")

    removed = sweep_stale_run_dirs(base, keep=dirs["self"])

    assert sorted(removed) == sorted([dirs["legacy"], dirs["orphan"]])
    left = {p.name for p in base.iterdir()}
    assert left == {key("owned"), key("running"), key("self"), "egress-slots"}
    assert (slots / "1").read_text() == "owner\n"
