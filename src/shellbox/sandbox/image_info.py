"""What a built image contains, asked of the image itself: each tool's version, probed once at
build time (before the tree is made read-only) and kept in ``info.json`` next to it, with the
image's size and how long it took to build.

``shellbox image info`` prints it, the README's table is generated from it, and
``GET /v1/containers/{id}`` names the image a container runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from shellbox.errors import ImageBuildError


class BuiltImage(Protocol):
    """What is described of a built image (``image.Image``; no import of it: it imports us)."""

    @property
    def path(self) -> Path: ...

    @property
    def profile(self) -> str: ...


# name -> the shell command that prints its version (the first line with a dotted number wins).
# Tools a profile lacks print nothing and are left out.
TOOLS = (
    ("python", "python --version"),
    ("python3", "python3 --version"),
    ("pip", "pip --version"),
    ("node", "node --version"),
    ("npm", "npm --version"),
    ("java", "java -XX:-UsePerfData -version 2>&1"),
    ("php", "php --version"),
    ("ruby", "ruby --version"),
    ("go", "go version"),
    ("gcc", "gcc --version"),
    ("sqlite3", "sqlite3 --version"),
    ("ffmpeg", "ffmpeg -version"),
    ("imagemagick", "convert -version"),
    ("poppler", "pdftotext -v 2>&1"),
    ("git", "git --version"),
    ("curl", "curl --version"),
    ("jq", "jq --version"),
)
PYTHON_LIBRARIES = ("numpy", "pandas", "matplotlib", "scipy", "PIL", "openpyxl", "requests")
VERSION = re.compile(r"\d+(?:\.\d+)+")
INFO_FILE = "info.json"


def probe_script() -> str:
    """One shell script printing ``name<TAB>output`` for every tool the image has."""
    lines = [
        f'if command -v {cmd.split()[0]} >/dev/null; then printf "{name}\\t%s\\n"'
        f' "$({cmd} | grep -m1 -E "[0-9]+\\.[0-9]")"; fi'
        for name, cmd in TOOLS
    ]
    for lib in PYTHON_LIBRARIES:
        code = f"import {lib}; print({lib}.__version__)"
        lines.append(f'v=$(python3 -B -c "{code}" 2>/dev/null) && printf "{lib}\\t%s\\n" "$v"')
    # A tool the image lacks is no failure: a non-zero exit is the chroot's own.
    return "\n".join([*lines, "exit 0"]) + "\n"


def parse_versions(output: str) -> dict[str, str]:
    versions = {}
    for line in output.splitlines():
        name, _, text = line.partition("\t")
        found = VERSION.search(text)
        if found:
            versions["pillow" if name == "PIL" else name] = found.group(0)
    return versions


def probe_versions(rootfs: Path) -> dict[str, str]:
    """Run the probes in ``rootfs`` (as root, in a private mount and pid namespace with its own
    /proc, before ownership is shifted) and remove what they left in /tmp."""
    home = rootfs / "tmp" / "shellbox-probe"
    home.mkdir(parents=True, exist_ok=True)
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        f"--mount-proc={rootfs / 'proc'}",
        "chroot",
        str(rootfs),
        "/usr/bin/env",
        "-i",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "HOME=/tmp/shellbox-probe",
        "LANG=C.UTF-8",
        "PYTHONDONTWRITEBYTECODE=1",
        "GOTOOLCHAIN=local",
        "/bin/bash",
        "-c",
        probe_script(),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0:
        msg = f"probing the image's versions failed ({proc.returncode}): {proc.stderr[-500:]}"
        raise ImageBuildError(msg)
    return parse_versions(proc.stdout)


def tree_size(root: Path) -> int:
    """Bytes the tree takes on disk (hard links counted once, symlinks not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def describe(image: BuiltImage) -> dict[str, Any]:
    """The image's id, profile and what ``info.json`` recorded when it was built."""
    root = image.path.parent
    info_path = root / INFO_FILE
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return {"id": root.name, "profile": image.profile, **info}


def markdown_table(images: Sequence[BuiltImage]) -> str:
    """One column per image, one row per tool (``-`` where an image lacks it)."""
    described = [describe(i) for i in images]
    names = [n for n, _ in TOOLS] + ["pillow" if n == "PIL" else n for n in PYTHON_LIBRARIES]
    head = "| | " + " | ".join(f"`{d['profile']}`" for d in described) + " |"
    rows = [head, "|---" * (len(described) + 1) + "|"]
    for name in names:
        cells = [d.get("versions", {}).get(name, "-") for d in described]
        if any(c != "-" for c in cells):
            rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows.append("| size on disk | " + " | ".join(_mb(d) for d in described) + " |")
    rows.append("| build time here | " + " | ".join(_seconds(d) for d in described) + " |")
    return "\n".join(rows)


def _mb(d: dict[str, Any]) -> str:
    return f"{d['size_bytes'] / 1e6:,.0f} MB" if "size_bytes" in d else "?"


def _seconds(d: dict[str, Any]) -> str:
    return f"{d['build_seconds']:.0f} s" if "build_seconds" in d else "?"
