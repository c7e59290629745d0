"""The image builder: cached by its recipe, never removing through a mount, and saying which
package failed when mmdebstrap does."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

from sandbox_helpers import IMAGE_DIR

from shellbox.sandbox import image


def test_a_built_image_is_reused_and_keyed_by_its_recipe() -> None:
    out = io.StringIO()
    built = image.ensure_image(IMAGE_DIR, "minimal", out=out)
    assert built.ready and out.getvalue() == ""  # no progress bar: nothing was built
    assert built.path == IMAGE_DIR / f"minimal-{image.recipe_hash('minimal')}" / "rootfs"
    stored = json.loads((built.path.parent / "recipe.json").read_text())
    assert stored == json.loads(json.dumps(image.recipe("minimal")))
    assert image.recipe_hash("minimal") != image.recipe_hash("full")
    assert (built.path / "usr/bin/node").exists() and (built.path / "usr/bin/python3").exists()


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
