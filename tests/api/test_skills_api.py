"""The Skills API through the official openai SDK: create from a zip and from a folder,
versions and defaults, content round trips, pagination, deletion rules, tenancy."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest


def skill_md(name: str, description: str = "A test skill.", body: str = "Do things.\n") -> bytes:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}".encode()


def make_zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def zip_files(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def disk(server: Any) -> Path:
    return server.state_dir / "skills"


@pytest.fixture(scope="module")
def other(server: Any) -> Iterator[Any]:
    """A client of another project."""
    key = server.create_key("skills-other")
    with openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0) as c:
        yield c


def test_create_from_zip_round_trips_byte_for_byte(client: Any, server: Any) -> None:
    data = make_zip(
        {
            "csv-insights/SKILL.md": skill_md("csv-insights", "Summarize CSV files."),
            "csv-insights/scripts/report.py": b"print('report')\n",
        }
    )
    skill = client.skills.create(files=("csv_insights.zip", data, "application/zip"))
    assert skill.id.startswith("skill_")
    assert skill.object == "skill"
    assert (skill.name, skill.description) == ("csv-insights", "Summarize CSV files.")
    assert (skill.default_version, skill.latest_version) == ("1", "1")
    assert client.skills.retrieve(skill.id) == skill
    assert client.skills.content.retrieve(skill.id).read() == data
    assert client.skills.versions.content.retrieve("1", skill_id=skill.id).read() == data
    assert client.skills.versions.content.retrieve("latest", skill_id=skill.id).read() == data
    version = client.skills.versions.retrieve("1", skill_id=skill.id)
    assert version.object == "skill.version"
    assert (version.skill_id, version.version, version.name) == (skill.id, "1", "csv-insights")
    # Unpacked once on the host, without the shared top folder, readable by the sandbox.
    files = disk(server) / "versions" / skill.id / "1" / "files"
    assert (files / "SKILL.md").read_bytes().startswith(b"---")
    assert (files / "scripts" / "report.py").stat().st_mode & 0o777 == 0o644
    client.skills.delete(skill.id)


def test_create_from_folder_keeps_relative_paths(client: Any) -> None:
    folder = [
        ("my-skill/SKILL.md", skill_md("my-skill")),
        ("my-skill/scripts/run.py", b"#!/usr/bin/env python3\nprint('run')\n"),
        ("my-skill/assets/logo.txt", b"logo"),
    ]
    skill = client.skills.create(files=folder)
    assert skill.name == "my-skill"
    bundle = client.skills.content.retrieve(skill.id).read()
    assert zip_files(bundle) == {
        "SKILL.md": folder[0][1],
        "assets/logo.txt": b"logo",
        "scripts/run.py": folder[1][1],
    }
    # The zip built from a folder is deterministic: same files, same bytes.
    again = client.skills.create(files=list(reversed(folder)))
    assert client.skills.content.retrieve(again.id).read() == bundle
    # A folder of one file: SKILL.md alone, as a single 'files' part.
    single = client.skills.create(files=("SKILL.md", skill_md("solo")))
    assert single.name == "solo"
    for s in (skill, again, single):
        client.skills.delete(s.id)


def test_versions_and_defaults(client: Any) -> None:
    v1 = make_zip({"SKILL.md": skill_md("versioned", "first")})
    v2 = make_zip({"SKILL.md": skill_md("versioned", "second")})
    v3 = make_zip({"SKILL.md": skill_md("versioned", "third")})
    skill = client.skills.create(files=("v1.zip", v1))
    two = client.skills.versions.create(skill.id, files=("v2.zip", v2))
    assert (two.version, two.description, two.object) == ("2", "second", "skill.version")
    s = client.skills.retrieve(skill.id)
    assert (s.default_version, s.latest_version, s.description) == ("1", "2", "first")
    three = client.skills.versions.create(skill.id, files=("v3.zip", v3), default=True)
    s = client.skills.retrieve(skill.id)
    assert (s.default_version, s.latest_version, s.description) == ("3", "3", "third")
    assert client.skills.versions.retrieve("latest", skill_id=skill.id).id == three.id
    assert client.skills.content.retrieve(skill.id).read() == v3

    s = client.skills.update(skill.id, default_version="1")
    assert (s.default_version, s.description) == ("1", "first")
    assert client.skills.content.retrieve(skill.id).read() == v1
    assert client.skills.versions.content.retrieve("2", skill_id=skill.id).read() == v2
    s = client.skills.update(skill.id, default_version="latest")
    assert s.default_version == "3"
    four = client.skills.versions.create(skill.id, files=("v.zip", v1), default=False)
    assert client.skills.retrieve(skill.id).default_version == "3"
    assert four.version == "4"

    asc = [v.version for v in client.skills.versions.list(skill.id, order="asc")]
    assert asc == ["1", "2", "3", "4"]
    desc = [v.version for v in client.skills.versions.list(skill.id, order="desc", limit=3)]
    assert desc == ["4", "3", "2", "1"]  # the SDK pages through
    page = client.skills.versions.list(skill.id, order="asc", limit=2)
    assert [v.version for v in page.data] == ["1", "2"] and page.has_more
    nxt = client.skills.versions.list(skill.id, order="asc", limit=2, after=page.data[-1].id)
    assert [v.version for v in nxt.data] == ["3", "4"] and not nxt.has_more

    with pytest.raises(openai.NotFoundError):
        client.skills.update(skill.id, default_version="9")
    with pytest.raises(openai.BadRequestError, match="positive version number"):
        client.skills.update(skill.id, default_version="one")
    for bad in ("0", "-1", "1.5", "99999999999999999999999", "²"):
        with pytest.raises(openai.BadRequestError, match="positive version number"):
            client.skills.versions.retrieve(bad, skill_id=skill.id)
    client.skills.delete(skill.id)


def test_deletion_rules(client: Any, server: Any) -> None:
    v1 = make_zip({"SKILL.md": skill_md("deletable", "one")})
    v2 = make_zip({"SKILL.md": skill_md("deletable", "two")})
    skill = client.skills.create(files=("v1.zip", v1))
    with pytest.raises(openai.BadRequestError, match="default version"):
        client.skills.versions.delete("1", skill_id=skill.id)
    client.skills.versions.create(skill.id, files=("v2.zip", v2))
    client.skills.versions.create(skill.id, files=("v3.zip", v2))
    gone = client.skills.versions.delete("latest", skill_id=skill.id)
    assert (gone.object, gone.deleted, gone.version) == ("skill.version.deleted", True, "3")
    assert not (disk(server) / "versions" / skill.id / "3").exists()
    with pytest.raises(openai.NotFoundError):
        client.skills.versions.retrieve("3", skill_id=skill.id)
    with pytest.raises(openai.NotFoundError):
        client.skills.versions.content.retrieve("3", skill_id=skill.id)
    assert client.skills.retrieve(skill.id).latest_version == "2"
    # Numbers are never reused: a number always names the same bytes.
    assert client.skills.versions.create(skill.id, files=("v.zip", v2)).version == "4"
    deleted = client.skills.delete(skill.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (skill.id, "skill.deleted", True)
    assert not (disk(server) / "versions" / skill.id).exists()
    for call in (
        lambda: client.skills.retrieve(skill.id),
        lambda: client.skills.delete(skill.id),
        lambda: client.skills.content.retrieve(skill.id),
        lambda: client.skills.versions.list(skill.id),
        lambda: client.skills.versions.create(skill.id, files=("v.zip", v1)),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def test_pagination(server: Any) -> None:
    key = server.create_key("skills-paging")
    with openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0) as c:
        _paginate(c)


def _paginate(c: Any) -> None:
    ids = [
        c.skills.create(files=("s.zip", make_zip({"SKILL.md": skill_md(f"page-{i}")}))).id
        for i in range(5)
    ]
    assert [s.id for s in c.skills.list(limit=2, order="asc")] == ids
    assert [s.id for s in c.skills.list(limit=2)] == ids[::-1]  # desc by default
    first = c.skills.list(limit=2, order="asc")
    assert [s.id for s in first.data] == ids[:2] and first.has_more
    last = c.skills.list(limit=3, order="asc", after=ids[1])
    assert [s.id for s in last.data] == ids[2:] and not last.has_more
    for skill_id in ids:
        c.skills.delete(skill_id)
    assert c.skills.list().data == []


def test_tenant_isolation(client: Any, other: Any) -> None:
    skill = client.skills.create(files=("s.zip", make_zip({"SKILL.md": skill_md("private")})))
    assert skill.id not in [s.id for s in other.skills.list()]
    for call in (
        lambda: other.skills.retrieve(skill.id),
        lambda: other.skills.update(skill.id, default_version="1"),
        lambda: other.skills.delete(skill.id),
        lambda: other.skills.content.retrieve(skill.id),
        lambda: other.skills.versions.list(skill.id),
        lambda: other.skills.versions.retrieve("1", skill_id=skill.id),
        lambda: other.skills.versions.content.retrieve("1", skill_id=skill.id),
        lambda: other.skills.versions.delete("1", skill_id=skill.id),
        lambda: other.skills.versions.create(skill.id, files=("s.zip", b"PK")),
        lambda: other.containers.create(
            name="steal", skills=[{"type": "skill_reference", "skill_id": skill.id}]
        ),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert skill.id in str(info.value)  # the same 404 as an id that never existed
    assert "steal" not in [c.name for c in other.containers.list()]
    assert client.skills.retrieve(skill.id).id == skill.id  # untouched
    client.skills.delete(skill.id)
