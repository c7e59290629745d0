"""Every bundle the server refuses is a 400 that says what is wrong, and leaves nothing on
disk. A server with small caps keeps the over-cap uploads small."""

from __future__ import annotations

import io
import os
import stat
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

MiB = 1 << 20
CAPS_ENV = {
    "SHELLBOX_SKILLS__MAX_FILES": "20",
    "SHELLBOX_SKILLS__MAX_FILE_BYTES": str(2 * MiB),
    "SHELLBOX_SKILLS__MAX_BUNDLE_BYTES": str(4 * MiB),
}
GOOD_MD = b"---\nname: good\ndescription: A good skill.\n---\nBody.\n"


@pytest.fixture(scope="module")
def capped(server_factory: Callable[..., Any]) -> Any:
    srv = server_factory(start=False, env=dict(CAPS_ENV))
    srv.env["SHELLBOX_TEST_KEY"] = srv.create_key("caps")
    return srv.start()


@pytest.fixture(scope="module")
def sdk(capped: Any) -> Iterator[Any]:
    key = capped.env["SHELLBOX_TEST_KEY"]
    with openai.OpenAI(base_url=capped.base_url, api_key=key, max_retries=0) as c:
        yield c


def make_zip(entries: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
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


def with_md(extra: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    return make_zip({"SKILL.md": GOOD_MD, **extra}, modes)


def lie_about_size(data: bytes, name: bytes, size: int) -> bytes:
    """Rewrite the uncompressed size of ``name`` in its local and central headers."""
    out = bytearray(data)
    headers = ((b"PK\x03\x04", 26, 22, 30), (b"PK\x01\x02", 28, 24, 46))
    for sig, name_len_at, size_at, name_at in headers:
        pos = out.find(sig)
        while pos != -1:
            n = struct.unpack_from("<H", out, pos + name_len_at)[0]
            if bytes(out[pos + name_at : pos + name_at + n]) == name:
                struct.pack_into("<I", out, pos + size_at, size)
            pos = out.find(sig, pos + 4)
    return bytes(out)


def hex_noise(n: int) -> bytes:
    """Text that deflates about 2:1: large when unpacked, not a bomb."""
    return os.urandom(n // 2).hex().encode()


# Each bundle is built when its case runs, not when the suite is collected.
ZIP_CASES: list[tuple[str, Callable[[], bytes], str]] = [
    ("no_skill_md", lambda: make_zip({"README.md": b"# hi"}), "no SKILL.md at its root"),
    (
        "nested_skill_md",
        lambda: make_zip({"a/b/SKILL.md": GOOD_MD, "a/c": b""}),
        "found 'b/SKILL.md'",
    ),
    ("no_front_matter", lambda: make_zip({"SKILL.md": b"# Title\n"}), "no YAML front matter"),
    ("unclosed", lambda: make_zip({"SKILL.md": b"---\nname: x\n"}), "not closed"),
    ("bad_yaml", lambda: make_zip({"SKILL.md": b"---\nname: [x\n---\n"}), "not valid YAML"),
    ("no_name", lambda: make_zip({"SKILL.md": b"---\ndescription: d\n---\n"}), "has no 'name'"),
    (
        "bad_slug",
        lambda: make_zip({"SKILL.md": b"---\nname: Not A Slug!\ndescription: d\n---\n"}),
        "not a short slug",
    ),
    ("no_description", lambda: make_zip({"SKILL.md": b"---\nname: ok\n---\n"}), "'description'"),
    ("zip_slip", lambda: with_md({"../../evil.sh": b"pwned"}), "outside the skill folder"),
    ("absolute", lambda: with_md({"/etc/cron.d/evil": b"pwned"}), "absolute path"),
    (
        "symlink",
        lambda: with_md({"link": b"/etc/shadow"}, {"link": stat.S_IFLNK | 0o777}),
        "symlink",
    ),
    ("device", lambda: with_md({"dev": b""}, {"dev": stat.S_IFCHR | 0o666}), "device file"),
    ("too_many_files", lambda: with_md({f"f{i}": b"" for i in range(20)}), "at most 20"),
    ("file_over_cap", lambda: with_md({"big.bin": os.urandom(3 * MiB)}), "big.bin"),
    (
        "bundle_over_cap",
        lambda: with_md({f"p{i}.txt": hex_noise(int(1.5 * MiB)) for i in range(3)}),
        "declares 4.5 MiB of files",
    ),
    (
        "zip_over_cap",
        lambda: with_md({f"r{i}.bin": os.urandom(MiB) for i in range(5)}),
        "larger than the 4 MiB",
    ),
    ("zip_bomb", lambda: with_md({"zeros.bin": bytes(int(1.9 * MiB))}), "zip bomb"),
    (
        "size_lie",
        lambda: lie_about_size(with_md({"data.bin": os.urandom(100_000)}), b"data.bin", 100),
        "more than the 100 bytes its header declares",
    ),
    ("not_a_zip", lambda: b"PK\x03\x04garbage", "not a valid zip"),
]


def snapshot(srv: Any) -> set[str]:
    root = srv.state_dir / "skills"
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(("case", "build", "needle"), ZIP_CASES, ids=[c[0] for c in ZIP_CASES])
def test_zip_is_refused_and_leaves_nothing(
    sdk: Any, capped: Any, case: str, build: Callable[[], bytes], needle: str
) -> None:
    data = build()
    before = snapshot(capped)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.skills.create(files=(f"{case}.zip", data, "application/zip"))
    assert needle in info.value.message
    assert info.value.body["param"] == "files"
    assert snapshot(capped) == before
    assert sdk.skills.list().data == []
    assert not (capped.state_dir.parent / "evil.sh").exists()


def test_new_version_is_validated_too(sdk: Any, capped: Any) -> None:
    skill = sdk.skills.create(files=("ok.zip", with_md({})))
    before = snapshot(capped)
    with pytest.raises(openai.BadRequestError, match="outside the skill folder"):
        sdk.skills.versions.create(skill.id, files=("v.zip", with_md({"../x": b""})))
    assert snapshot(capped) == before
    assert sdk.skills.retrieve(skill.id).latest_version == "1"
    sdk.skills.delete(skill.id)


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ([("SKILL.md", GOOD_MD), ("../escape.txt", b"x")], "outside the skill folder"),
        ([("s/SKILL.md", GOOD_MD), ("/abs.txt", b"x")], "absolute path"),
        ([("notes.txt", b"x"), ("more.txt", b"y")], "no SKILL.md"),
        ([("SKILL.md", GOOD_MD)] + [(f"f{i}.txt", b"") for i in range(20)], "at most 20"),
        ([("SKILL.md", GOOD_MD)] + [(f"f{i}.txt", b"") for i in range(40)], "more than 20"),
        ([("SKILL.md", GOOD_MD), ("big.bin", os.urandom(3 * MiB))], "big.bin"),
        ([("SKILL.md", GOOD_MD), ("SKILL.md", GOOD_MD)], "twice"),
        ([("SKILL.md", b"---\nname: UPPER\ndescription: d\n---\n")], "not a short slug"),
    ],
    ids=[
        "slip",
        "absolute",
        "no_skill_md",
        "too_many",
        "far_too_many",
        "file_over_cap",
        "duplicate",
        "slug",
    ],
)
def test_folder_is_refused_and_leaves_nothing(
    sdk: Any, capped: Any, files: list[tuple[str, bytes]], needle: str
) -> None:
    before = snapshot(capped)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.skills.create(files=files)
    assert needle in info.value.message
    assert snapshot(capped) == before


def test_malformed_requests(capped: Any) -> None:
    import httpx

    headers = {"authorization": f"Bearer {capped.env['SHELLBOX_TEST_KEY']}"}
    with httpx.Client(base_url=capped.base_url, headers=headers) as h:
        r = h.post("/skills", json={"files": "x"})
        assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]
        r = h.post("/skills", files={"other": ("a.txt", b"x")})
        assert r.status_code == 400 and "'files'" in r.json()["error"]["message"]
        r = h.post("/skills", data={"files": "not a file"}, files={"x": ("a", b"")})
        assert r.status_code == 400 and "must be a file" in r.json()["error"]["message"]
        skill = h.post("/skills", files={"files": ("s.zip", with_md({}))}).json()
        r = h.post(
            f"/skills/{skill['id']}/versions",
            data={"default": "maybe"},
            files={"files": ("s.zip", with_md({}))},
        )
        assert r.status_code == 400 and "'default'" in r.json()["error"]["message"]
        r = h.post(f"/skills/{skill['id']}", json={})
        assert r.status_code == 400 and "default_version" in r.json()["error"]["message"]
        assert h.delete(f"/skills/{skill['id']}").status_code == 200


def test_nothing_left_after_refusals(capped: Any) -> None:
    root: Path = capped.state_dir / "skills"
    assert list((root / "staging").iterdir()) == []
    assert list((root / "containers").iterdir()) == []
