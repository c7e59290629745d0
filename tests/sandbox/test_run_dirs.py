"""Volatile /run/shellbox/<key> directories of vanished state directories are swept."""

from __future__ import annotations

from pathlib import Path

from shellbox.sandbox.crun import OWNER_FILE, sweep_stale_run_dirs


def test_sweep_removes_only_dirs_of_missing_owners_without_oci_state(tmp_path: Path) -> None:
    base = tmp_path / "run"
    alive_owner = tmp_path / "state-alive"
    alive_owner.mkdir()
    dirs = {name: base / name for name in ("owned", "orphan", "running", "legacy", "self")}
    for d in dirs.values():
        (d / "crun").mkdir(parents=True)
        (d / "sock").mkdir()
    (dirs["owned"] / OWNER_FILE).write_text(str(alive_owner))
    (dirs["orphan"] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    (dirs["running"] / OWNER_FILE).write_text(str(tmp_path / "gone"))
    (dirs["running"] / "crun" / "cntr_x").mkdir()  # the OCI runtime still knows a container
    (dirs["self"] / OWNER_FILE).write_text(str(tmp_path / "gone"))

    removed = sweep_stale_run_dirs(base, keep=dirs["self"])

    assert sorted(p.name for p in removed) == ["legacy", "orphan"]
    assert sorted(p.name for p in base.iterdir()) == ["owned", "running", "self"]
