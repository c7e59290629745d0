"""fs: every error a client's path can cause is a 400 naming the field, a failed write leaves
nothing behind, and ``resolve`` follows links only while they stay inside /mnt/data."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellbox.errors import FileNotFound, InvalidRequest, PathOutsideWorkspace, PayloadTooLarge
from shellbox.sandbox import datafs as fs

UID = os.getuid()


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Each is refused by the kernel (or cannot be encoded for it): ENAMETOOLONG for one long
# component, a whole path over PATH_MAX, an unpaired surrogate.
TOO_LONG = [
    "a" * 256,
    "new/" + "a" * 256,
    "new/deeper/" + "é" * 128,  # 256 bytes in 128 characters
    "/".join(["d" * 200] * 21),  # every component fits, the whole is over 4096 bytes
    "new/\udcff",
]


@pytest.mark.parametrize("name", TOO_LONG)
def test_names_the_kernel_refuses_are_client_errors(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        fs.relative_path(name, param="file")
    assert exc.value.param == "file" and exc.value.status == 400
    assert _tree(tmp_path) == []


def test_longest_names_the_kernel_takes_are_accepted(tmp_path: Path) -> None:
    for name in ("a" * 255, "b/" + "é" * 127 + "x"):
        rel = fs.relative_path(name)
        assert fs.write_file(tmp_path, rel, iter([b"ok"]), uid=UID) == 2
        assert (tmp_path / rel).read_bytes() == b"ok"


def test_every_path_oserror_is_mapped_whatever_the_entry_point(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/etc")
    # Straight to the fs layer (bypassing relative_path's checks): still never a bare OSError.
    cases = {
        "file.txt/below": "not a directory",  # ENOTDIR
        "link/passwd": "symbolic link",  # ENOTDIR too (O_DIRECTORY|O_NOFOLLOW on a link)
        "x" * 300: "over 255 bytes",  # ENAMETOOLONG at the last component
        "q" * 300 + "/y": "over 255 bytes",  # ENAMETOOLONG on the way
        "dir": "is a directory",
    }
    for rel, says in cases.items():
        with pytest.raises(InvalidRequest) as exc:
            fs.write_file(tmp_path, rel, iter([b"x"]), uid=UID, param="file")
        assert exc.value.param == "file" and says in exc.value.message, (rel, exc.value.message)
        if rel != "dir":
            for call in (fs.open_read, fs.delete):
                with pytest.raises(InvalidRequest) as exc:
                    call(tmp_path, rel, param="file")  # type: ignore[operator]
                assert exc.value.param == "file", (rel, call)
    assert _tree(tmp_path) == ["dir", "file.txt", "link"]


def _failing(after: int) -> Iterator[bytes]:
    yield b"x" * after
    raise PayloadTooLarge("too large", param="body")


def test_a_failed_write_leaves_no_directories_or_temporary_files(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    with pytest.raises(PayloadTooLarge):
        fs.write_file(tmp_path, "kept/new/deeper/f.txt", _failing(100), uid=UID)
    assert _tree(tmp_path) == ["kept"]
    # A name refused only at the end (the fs layer is reached without relative_path's check).
    with pytest.raises(InvalidRequest):
        fs.write_file(tmp_path, "kept/new/deeper/" + "z" * 300, iter([b"x"]), uid=UID)
    assert _tree(tmp_path) == ["kept"]
    # A directory the sandbox filled meanwhile is not ours to remove.
    fs.write_file(tmp_path, "kept/new/f.txt", iter([b"ok"]), uid=UID)
    assert _tree(tmp_path) == ["kept", "kept/new", "kept/new/f.txt"]


def test_resolve_follows_links_only_inside_the_data_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.txt").write_text("inside")
    (tmp_path / "rel-link").symlink_to("real/f.txt")
    (tmp_path / "abs-link").symlink_to("/mnt/data/real/f.txt")
    (tmp_path / "dir-link").symlink_to("real")
    (tmp_path / "up-link").symlink_to("../real")  # from real/.. : back inside
    (tmp_path / "real" / "up-link").symlink_to("../real/f.txt")
    (tmp_path / "dangling").symlink_to("real/new.txt")
    (tmp_path / "root-link").symlink_to("/mnt/data")
    assert fs.resolve(tmp_path, "rel-link") == "real/f.txt"
    assert fs.resolve(tmp_path, "abs-link") == "real/f.txt"
    assert fs.resolve(tmp_path, "dir-link/f.txt") == "real/f.txt"
    assert fs.resolve(tmp_path, "real/up-link") == "real/f.txt"
    assert fs.resolve(tmp_path, "root-link/real/f.txt") == "real/f.txt"
    assert fs.resolve(tmp_path, "dangling") == "real/new.txt"  # a write creates the target
    assert fs.resolve(tmp_path, "new/dir/f.txt") == "new/dir/f.txt"

    for target in (
        "/etc/passwd",
        "../outside.txt",
        "../../etc/passwd",
        "real/../../x",
        "/mnt/data/../etc",
        "/mnt/datax/f",
        "/mnt/skills/s/SKILL.md",
        "/proc/self/root/etc/passwd",
    ):
        link = tmp_path / "escape"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        for rel in ("escape", "dir-link/../escape"):
            with pytest.raises(PathOutsideWorkspace) as exc:
                fs.resolve(tmp_path, rel, param="path")
            assert exc.value.code == "path_outside_workspace" and exc.value.param == "path"
    # Through a link to a directory that leads out.
    (tmp_path / "etc").symlink_to("/etc")
    with pytest.raises(PathOutsideWorkspace):
        fs.resolve(tmp_path, "etc/passwd")
    # A loop is a client error, not a hang or a 500.
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    with pytest.raises(InvalidRequest) as loop:
        fs.resolve(tmp_path, "loop-a")
    assert "links" in loop.value.message
    # A file used as a directory, and '..' past something missing.
    with pytest.raises(InvalidRequest):
        fs.resolve(tmp_path, "real/f.txt/x")
    (tmp_path / "gone-up").symlink_to("missing/../real/f.txt")
    with pytest.raises(FileNotFound):
        fs.resolve(tmp_path, "gone-up")
    # Nothing outside was touched or created on the way.
    assert not Path("/mnt/data/real").exists()


def test_deep_paths_cost_a_bounded_number_of_descriptors(tmp_path: Path) -> None:
    deep = "/".join(["d"] * 300) + "/f.txt"
    # With 64 descriptors in all: a write or a resolve that kept every directory on the way
    # open would fail with EMFILE (a 500).
    code = (
        "import os, resource, sys; from pathlib import Path\n"
        "from shellbox.sandbox import datafs as fs\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        f"root = Path({str(tmp_path)!r})\n"
        f"print(fs.write_file(root, {deep!r}, iter([b'ok']), uid=os.getuid()))\n"
        f"fd = fs.open_read(root, {deep!r}); print(os.read(fd, 10).decode())\n"
        f"print(fs.resolve(root, {deep!r}) == {deep!r})\n"
        # a link back up at the bottom: each '..' is cheap, the walk down again is one pass
        f"os.symlink('../' * 300 + {deep!r}, root / {deep!r}.replace('f.txt', 'back'))\n"
        f"print(fs.resolve(root, {deep!r}.replace('f.txt', 'back')) == {deep!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "ok", "True", "True"]
