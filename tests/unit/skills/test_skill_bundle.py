"""Bundle validation and unpacking: every refusal names the problem, and nothing is trusted
from a zip's headers."""

from __future__ import annotations

import io
import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path

import pytest

from shellbox.skills.bundle import (
    BundleError,
    Caps,
    FolderUpload,
    ZipUpload,
    build_zip,
    classify,
    entry_path,
    parse_skill_md,
    stage,
    unpack_folder,
    unpack_zip,
)

CAPS = Caps(max_files=10, max_file_bytes=4 << 20, max_bundle_bytes=8 << 20, max_expansion_ratio=50)
SKILL_MD = b"---\nname: csv-insights\ndescription: Summarize CSV files.\n---\nRead the CSV.\n"


def make_zip(entries: dict[str, bytes], *, modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            if modes and name in modes:
                info.create_system = 3
                info.external_attr = modes[name] << 16
            zf.writestr(info, data)
    return buf.getvalue()


def unpack(data: bytes, dest: Path, caps: Caps = CAPS) -> object:
    return unpack_zip(io.BytesIO(data), len(data), dest, caps)


def refused(data: bytes, tmp_path: Path, caps: Caps = CAPS, out: str = "out") -> str:
    with pytest.raises(BundleError) as info:
        unpack(data, tmp_path / out, caps)
    return info.value.message


def test_unpacks_a_zip_with_a_top_folder(tmp_path: Path) -> None:
    data = make_zip(
        {
            "csv-insights/SKILL.md": SKILL_MD,
            "csv-insights/scripts/run.sh": b"#!/bin/sh\necho hi\n",
            "csv-insights/data/x.txt": b"x",
            "__MACOSX/csv-insights/._SKILL.md": b"junk",
        }
    )
    m = unpack(data, tmp_path / "out")
    out = tmp_path / "out"
    assert m.name == "csv-insights" and m.description == "Summarize CSV files."  # type: ignore[attr-defined]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "SKILL.md",
        "data/x.txt",
        "scripts/run.sh",
    ]
    assert stat.S_IMODE(os.stat(out / "scripts/run.sh").st_mode) == 0o755  # shebang
    assert stat.S_IMODE(os.stat(out / "SKILL.md").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(out / "scripts").st_mode) == 0o755


def test_keeps_the_executable_bit_of_zip_entries(tmp_path: Path) -> None:
    data = make_zip({"SKILL.md": SKILL_MD, "tool": b"\x7fELF"}, modes={"tool": 0o100755})
    unpack(data, tmp_path / "out")
    assert stat.S_IMODE(os.stat(tmp_path / "out/tool").st_mode) == 0o755


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("../evil.txt", "'..'"),
        ("a/../../evil.txt", "'..'"),
        ("/etc/evil", "absolute"),
        ("C:/evil", "absolute"),
        ("..\\evil.txt", "'..'"),
        ("a\x01b", "control character"),
    ],
)
def test_refuses_escaping_entries(tmp_path: Path, name: str, needle: str) -> None:
    msg = refused(make_zip({"SKILL.md": SKILL_MD, name: b"x"}), tmp_path)
    assert needle in msg
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        (stat.S_IFLNK | 0o777, "symlink"),
        (stat.S_IFCHR | 0o644, "device"),
        (stat.S_IFBLK | 0o644, "device"),
        (stat.S_IFIFO | 0o644, "pipe"),
    ],
)
def test_refuses_links_and_special_files(tmp_path: Path, mode: int, needle: str) -> None:
    data = make_zip({"SKILL.md": SKILL_MD, "odd": b"/etc/passwd"}, modes={"odd": mode})
    assert needle in refused(data, tmp_path)


def test_refuses_missing_skill_md(tmp_path: Path) -> None:
    assert "no SKILL.md" in refused(make_zip({"README.md": b"hi"}), tmp_path)
    msg = refused(make_zip({"a/b/SKILL.md": SKILL_MD, "c.txt": b""}), tmp_path)
    assert "found 'a/b/SKILL.md'" in msg


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b"# no front matter\n", "no YAML front matter"),
        (b"---\nname: a\ndescription: b\n", "not closed"),
        (b"---\nname: [unclosed\n---\n", "not valid YAML"),
        (b"---\n- a\n- b\n---\n", "YAML mapping"),
        (b"---\ndescription: b\n---\n", "no 'name'"),
        (b"---\nname: 12\ndescription: b\n---\n", "must be a string"),
        (b"---\nname: Has Spaces\ndescription: b\n---\n", "not a short slug"),
        (b"---\nname: ../up\ndescription: b\n---\n", "not a short slug"),
        (b"---\nname: " + b"a" * 65 + b"\ndescription: b\n---\n", "not a short slug"),
        (b"---\nname: ok\n---\n", "description"),
        (b"---\nname: ok\ndescription: '  '\n---\n", "description"),
        (b"\xff\xfe---\n", "UTF-8"),
    ],
)
def test_refuses_bad_front_matter(text: bytes, needle: str) -> None:
    with pytest.raises(BundleError) as info:
        parse_skill_md(text, param="files")
    assert needle in info.value.message


def test_front_matter_accepts_bom_and_extra_keys() -> None:
    text = b"\xef\xbb\xbf---\nname: my_skill-2\ndescription: >\n  Two\n  lines\nlicense: MIT\n---\n"
    assert parse_skill_md(text, param="files") == ("my_skill-2", "Two lines")


def test_refuses_too_many_files(tmp_path: Path) -> None:
    entries = {"SKILL.md": SKILL_MD} | {f"f{i}.txt": b"x" for i in range(10)}
    assert "at most 10" in refused(make_zip(entries), tmp_path)


def test_refuses_duplicates_and_file_folder_clashes(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, pytest.warns(UserWarning):
        zf.writestr("SKILL.md", SKILL_MD)
        zf.writestr("SKILL.md", SKILL_MD)
    assert "twice" in refused(buf.getvalue(), tmp_path)
    clash = make_zip({"SKILL.md": SKILL_MD, "a": b"x", "a/b": b"y"})
    assert "both a file and a folder" in refused(clash, tmp_path)


def test_refuses_files_over_the_caps(tmp_path: Path) -> None:
    big = os.urandom(5 << 20)
    msg = refused(make_zip({"SKILL.md": SKILL_MD, "big.bin": big}), tmp_path)
    assert "big.bin" in msg and "4 MiB" in msg
    parts = {f"p{i}.bin": os.urandom(3 << 20) for i in range(3)}
    msg = refused(make_zip({"SKILL.md": SKILL_MD, **parts}), tmp_path, caps=CAPS)
    assert "8 MiB" in msg


def test_refuses_a_zip_bomb_while_unpacking(tmp_path: Path) -> None:
    data = make_zip({"SKILL.md": SKILL_MD, "zeros.bin": bytes(3 << 20)})
    assert len(data) < 20_000
    assert "zip bomb" in refused(data, tmp_path)


def _patch_declared_size(data: bytes, name: bytes, size: int) -> bytes:
    """Rewrite the uncompressed size of ``name`` in its local and central headers."""
    out = bytearray(data)
    local = out.find(b"PK\x03\x04")
    while local != -1:
        n = struct.unpack_from("<H", out, local + 26)[0]
        if bytes(out[local + 30 : local + 30 + n]) == name:
            struct.pack_into("<I", out, local + 22, size)
        local = out.find(b"PK\x03\x04", local + 4)
    central = out.find(b"PK\x01\x02")
    while central != -1:
        n = struct.unpack_from("<H", out, central + 28)[0]
        if bytes(out[central + 46 : central + 46 + n]) == name:
            struct.pack_into("<I", out, central + 24, size)
        central = out.find(b"PK\x01\x02", central + 4)
    return bytes(out)


def test_refuses_a_zip_whose_sizes_lie(tmp_path: Path) -> None:
    payload = os.urandom(200_000)
    data = make_zip({"SKILL.md": SKILL_MD, "data.bin": payload})
    smaller = _patch_declared_size(data, b"data.bin", 10)
    msg = refused(smaller, tmp_path)
    assert "more than the 10 bytes its header declares" in msg
    larger = _patch_declared_size(data, b"data.bin", 300_000)
    assert "not the 300000 bytes" in refused(larger, tmp_path, out="out2")


def _local(name: bytes, method: int, crc: int, packed: bytes, size: int) -> bytes:
    head = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(packed), size, len(name), 0
    )
    return head + name + packed


def _central(name: bytes, method: int, crc: int, packed: int, size: int, offset: int) -> bytes:
    head = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        20,
        20,
        0,
        method,
        0,
        0,
        crc,
        packed,
        size,
        len(name),
        0,
        0,
        0,
        0,
        0,
        offset,
    )
    return head + name


def test_refuses_overlapping_entries(tmp_path: Path) -> None:
    """A non-recursive bomb: many directory entries sharing one compressed kernel."""
    kernel = bytes(2 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = comp.compress(kernel) + comp.flush()
    crc = zlib.crc32(kernel)
    body = _local(b"SKILL.md", 0, zlib.crc32(SKILL_MD), SKILL_MD, len(SKILL_MD))
    kernel_at = len(body)
    body += _local(b"k0.bin", 8, crc, packed, len(kernel))
    central = _central(b"SKILL.md", 0, zlib.crc32(SKILL_MD), len(SKILL_MD), len(SKILL_MD), 0)
    names = [b"k%d.bin" % i for i in range(8)]
    central += b"".join(_central(n, 8, crc, len(packed), len(kernel), kernel_at) for n in names)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 9, 9, len(central), len(body), 0)
    roomy = Caps(
        max_files=10, max_file_bytes=4 << 20, max_bundle_bytes=64 << 20, max_expansion_ratio=5000
    )
    # Each entry alone is within every cap; the second one reuses the first one's data.
    assert "corrupt" in refused(body + central + end, tmp_path, caps=roomy)


def test_refuses_unsupported_compression_and_encryption(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("SKILL.md", SKILL_MD)
    assert "compression method 12" in refused(buf.getvalue(), tmp_path)
    data = bytearray(make_zip({"SKILL.md": SKILL_MD}))
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        pos = data.find(sig)
        flags = struct.unpack_from("<H", data, pos + off)[0]
        struct.pack_into("<H", data, pos + off, flags | 1)
    assert "encrypted" in refused(bytes(data), tmp_path)


def test_refuses_what_is_not_a_zip(tmp_path: Path) -> None:
    assert "not a valid zip" in refused(b"PK\x03\x04 definitely not", tmp_path)


def test_folder_upload_and_deterministic_zip(tmp_path: Path) -> None:
    parts = [
        ("my-skill/SKILL.md", io.BytesIO(SKILL_MD)),
        ("my-skill/scripts/run.py", io.BytesIO(b"#!/usr/bin/env python3\nprint(1)\n")),
        ("my-skill/notes.txt", io.BytesIO(b"n")),
    ]
    m = unpack_folder(parts, tmp_path / "a", CAPS)
    assert (m.name, m.files) == ("csv-insights", 3)  # type: ignore[attr-defined]
    assert (tmp_path / "a/scripts/run.py").read_bytes().startswith(b"#!")
    assert stat.S_IMODE(os.stat(tmp_path / "a/scripts/run.py").st_mode) == 0o755
    build_zip(tmp_path / "a", tmp_path / "a.zip")
    for _, f in parts:
        f.seek(0)
    unpack_folder(list(reversed(parts)), tmp_path / "b", CAPS)
    build_zip(tmp_path / "b", tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert zf.namelist() == ["SKILL.md", "notes.txt", "scripts/run.py"]


def test_folder_upload_refusals(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"'\.\.'"):
        unpack_folder(
            [("SKILL.md", io.BytesIO(SKILL_MD)), ("../x", io.BytesIO(b""))], tmp_path / "a", CAPS
        )
    with pytest.raises(BundleError, match="filename"):
        unpack_folder([("", io.BytesIO(SKILL_MD))], tmp_path / "b", CAPS)
    with pytest.raises(BundleError, match="twice"):
        unpack_folder(
            [("SKILL.md", io.BytesIO(SKILL_MD)), ("./SKILL.md", io.BytesIO(b""))],
            tmp_path / "c",
            CAPS,
        )
    with pytest.raises(BundleError, match="larger than"):
        unpack_folder(
            [("SKILL.md", io.BytesIO(SKILL_MD)), ("x", io.BytesIO(bytes(5 << 20)))],
            tmp_path / "d",
            CAPS,
        )


def test_stage_keeps_zip_bytes_and_classify() -> None:
    data = make_zip({"SKILL.md": SKILL_MD})
    assert isinstance(classify([("s.zip", io.BytesIO(data))]), ZipUpload)
    assert isinstance(classify([("anything", io.BytesIO(data))]), ZipUpload)
    assert isinstance(classify([("SKILL.md", io.BytesIO(SKILL_MD))]), FolderUpload)
    with pytest.raises(BundleError, match="multipart"):
        classify([])


def test_stage_writes_bundle_and_files(tmp_path: Path) -> None:
    data = make_zip({"skill/SKILL.md": SKILL_MD})
    stage(ZipUpload(io.BytesIO(data)), tmp_path, CAPS)
    assert (tmp_path / "bundle.zip").read_bytes() == data
    assert (tmp_path / "files/SKILL.md").read_bytes() == SKILL_MD


def test_entry_path_normalises() -> None:
    assert entry_path("./a//b/./c", param="f") == "a/b/c"
    assert entry_path("dir/", param="f") == "dir"
    assert entry_path(".DS_Store", param="f") is None
    assert entry_path("./", param="f") is None
