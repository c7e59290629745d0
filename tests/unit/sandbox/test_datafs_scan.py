"""fs.scan: one open directory per level, whatever a sandbox puts in /mnt/data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shellbox.sandbox import datafs as fs


def test_thousands_of_directories_cost_one_descriptor_per_level(tmp_path: Path) -> None:
    for i in range(600):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / "f.txt").write_text("x")
    deep = tmp_path.joinpath(*[f"l{i}" for i in range(10)])
    deep.mkdir(parents=True)
    (deep / "deep.txt").write_text("y")
    # With 64 descriptors in all, a scan that kept every directory open would fail or drop
    # subtrees; a depth-first one needs about ten here.
    code = (
        "import resource, sys; from pathlib import Path\n"
        "from shellbox.sandbox import datafs as fs\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        f"print(len(fs.scan(Path({str(tmp_path)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "601"


def test_symlinks_and_special_files_are_not_listed(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("r")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.txt").write_text("i")
    (tmp_path / "to-etc").symlink_to("/etc")
    (tmp_path / "to-passwd").symlink_to("/etc/passwd")
    (tmp_path / ".shellbox-upload-1-2").write_text("partial")
    paths = sorted(e.path for e in fs.scan(tmp_path))
    assert paths == ["real.txt", "sub/inner.txt"]


def test_the_entry_budget_bounds_the_scan(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").write_text("x")
    assert len(fs.scan(tmp_path, limit=10)) == 10


def test_scan_counted_reports_what_the_scan_looked_at(tmp_path: Path) -> None:
    for i in range(3):
        d = tmp_path / f"d{i}"
        d.mkdir()
        for j in range(4):
            (d / f"f{j}").write_text("x")
    files, looked_at = fs.scan_counted(tmp_path)
    assert (len(files), looked_at) == (12, 15)
    assert fs.scan_counted(tmp_path / "missing") == ([], 0)
