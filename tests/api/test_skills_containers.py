"""Skills inside containers: referenced and inline skills mounted read-only under
/mnt/skills/<name>/, the index, version selection, name clashes, and deletion while in use."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import stat
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest


def skill_md(name: str, description: str, body: str = "Instructions.\n") -> bytes:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}".encode()


def make_zip(entries: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = ((modes or {}).get(name, 0o644) | stat.S_IFREG) << 16
            zf.writestr(info, data)
    return buf.getvalue()


def inline(name: str, data: bytes, description: str = "Inline skill.") -> dict[str, Any]:
    return {
        "type": "inline",
        "name": name,
        "description": description,
        "source": {
            "type": "base64",
            "media_type": "application/zip",
            "data": base64.b64encode(data).decode(),
        },
    }


def run(http: httpx.Client, cid: str, *commands: str) -> list[dict[str, Any]]:
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={"type": "shell_call", "call_id": "call_s", "action": {"commands": list(commands)}},
    )
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["output"]
    return out


def skills_disk(server: Any) -> Path:
    return server.state_dir / "skills"


def layouts(server: Any) -> Path:
    """Where the runtime keeps the skills it was given (``Runtime.install_skill``)."""
    return server.state_dir / "skill-layouts"


REPORTER = make_zip(
    {
        "reporter/SKILL.md": skill_md("reporter", "Writes reports.", "Run scripts/report.sh.\n"),
        "reporter/scripts/report.sh": b'#!/bin/sh\necho "report for $1"\n',
    },
    modes={"reporter/scripts/report.sh": 0o755},
)
CSV_INSIGHTS = make_zip(
    {
        "csv-insights/SKILL.md": skill_md("csv-insights", "Summarize CSV files."),
        "csv-insights/scripts/total.py": (
            b"import csv, sys\n"
            b"rows = list(csv.DictReader(open(sys.argv[1])))\n"
            b"print(sum(int(r['revenue']) for r in rows))\n"
        ),
    }
)


@pytest.fixture
def reporter(client: Any) -> Iterator[Any]:
    skill = client.skills.create(files=("reporter.zip", REPORTER, "application/zip"))
    yield skill
    with contextlib.suppress(openai.NotFoundError):
        client.skills.delete(skill.id)


def test_referenced_and_inline_skills_are_mounted(
    client: Any, http: httpx.Client, server: Any, reporter: Any
) -> None:
    c = client.containers.create(
        name="skills",
        skills=[
            {"type": "skill_reference", "skill_id": reporter.id},
            inline("csv-insights", CSV_INSIGHTS, "Summarize CSV files and report."),
        ],
    )
    listed = http.get(f"/v1/containers/{c.id}/skills").json()
    assert listed["object"] == "list"
    assert listed["data"] == [
        {
            "type": "skill_reference",
            "name": "reporter",
            "description": "Writes reports.",
            "skill_id": reporter.id,
            "version": "1",
            "path": "/mnt/skills/reporter",
        },
        {
            "type": "inline",
            "name": "csv-insights",
            "description": "Summarize CSV files and report.",
            "skill_id": None,
            "version": None,
            "path": "/mnt/skills/csv-insights",
        },
    ]
    out = run(
        http,
        c.id,
        "cat /mnt/skills/reporter/SKILL.md",
        "/mnt/skills/reporter/scripts/report.sh q3",
        "printf 'product,revenue\\nA,120\\nB,80\\n' > report.csv && "
        "python3 /mnt/skills/csv-insights/scripts/total.py report.csv",
        "cat /mnt/skills/index.json",
        "touch /mnt/skills/reporter/new",
        "echo x >> /mnt/skills/csv-insights/SKILL.md",
        "touch /mnt/skills/new-skill",
        "rm -f /mnt/skills/reporter/SKILL.md; test -f /mnt/skills/reporter/SKILL.md",
    )
    assert out[0]["stdout"].startswith("---\nname: reporter\n")
    assert out[0]["stdout"].endswith("Run scripts/report.sh.\n")
    assert out[1]["stdout"] == "report for q3\n"
    assert out[2]["stdout"] == "200\n"
    assert json.loads(out[3]["stdout"]) == listed
    for denied in out[4:7]:
        assert denied["outcome"]["exit_code"] != 0, denied
        assert "Read-only file system" in denied["stderr"] or "denied" in denied["stderr"]
    assert out[7]["outcome"]["exit_code"] == 0  # the file is still there
    # The inline skill lives with its container only.
    inline_dir = layouts(server) / f"inline.{c.id}.csv-insights"
    assert (inline_dir / "SKILL.md").is_file()
    client.containers.delete(c.id)
    assert not inline_dir.exists()
    assert (skills_disk(server) / "versions" / reporter.id / "1" / "files").is_dir()
    assert (layouts(server) / f"{reporter.id}.1" / "SKILL.md").is_file()
    assert http.get(f"/v1/containers/{c.id}/skills").status_code == 404


def test_version_selection(client: Any, http: httpx.Client, reporter: Any) -> None:
    v2 = make_zip({"SKILL.md": skill_md("reporter", "Second edition.")})
    client.skills.versions.create(reporter.id, files=("v2.zip", v2))
    picks: dict[str | None, str] = {None: "1", "latest": "2", "2": "2", "1": "1"}
    containers = []
    for version, expected in picks.items():
        ref: dict[str, Any] = {"type": "skill_reference", "skill_id": reporter.id}
        if version is not None:
            ref["version"] = version
        c = client.containers.create(name="pick", skills=[ref])
        containers.append(c.id)
        listed = http.get(f"/v1/containers/{c.id}/skills").json()
        assert listed["data"][0]["version"] == expected
    out = run(http, containers[1], "head -3 /mnt/skills/reporter/SKILL.md")
    assert "Second edition." in out[0]["stdout"]
    for cid in containers:
        client.containers.delete(cid)


def test_bad_skill_entries(client: Any, server: Any, reporter: Any) -> None:
    slip = make_zip({"SKILL.md": skill_md("slip", "d"), "../../escape.txt": b"x"})
    cases: list[tuple[list[dict[str, Any]], type[Exception], str]] = [
        (
            [{"type": "skill_reference", "skill_id": reporter.id}] * 2,
            openai.BadRequestError,
            "named 'reporter'",
        ),
        (
            [{"type": "skill_reference", "skill_id": reporter.id}, inline("reporter", REPORTER)],
            openai.BadRequestError,
            "named 'reporter'",
        ),
        (
            [{"type": "skill_reference", "skill_id": "skill_missing"}],
            openai.NotFoundError,
            "skill_missing",
        ),
        (
            [{"type": "skill_reference", "skill_id": reporter.id, "version": "7"}],
            openai.NotFoundError,
            "no version '7'",
        ),
        (
            [{"type": "skill_reference", "skill_id": reporter.id, "version": "v1"}],
            openai.BadRequestError,
            "positive version number",
        ),
        ([{"type": "skill_reference"}], openai.BadRequestError, "skill_id is required"),
        ([{"type": "mystery"}], openai.BadRequestError, "'skill_reference' or 'inline'"),
        ([inline("Bad Name", REPORTER)], openai.BadRequestError, "not a short slug"),
        ([inline("slip", slip)], openai.BadRequestError, "outside the skill folder"),
        (
            [
                {
                    **inline("x", REPORTER),
                    "source": {"type": "base64", "media_type": "application/zip", "data": "***"},
                }
            ],
            openai.BadRequestError,
            "not valid base64",
        ),
        (
            [{**inline("x", REPORTER), "source": {"type": "url"}}],
            openai.BadRequestError,
            "'base64'",
        ),
        ([inline("notzip", b"plain text")], openai.BadRequestError, "not a valid zip"),
    ]
    before = sorted(p.name for p in layouts(server).iterdir())
    for skills, error, needle in cases:
        with pytest.raises(error) as info:
            client.containers.create(name="bad-skills", skills=skills)
        assert needle in str(info.value), (skills, info.value)
    assert sorted(p.name for p in layouts(server).iterdir()) == before
    assert "bad-skills" not in [c.name for c in client.containers.list(name="bad-skills")]


def test_deleting_what_a_container_uses(
    client: Any, http: httpx.Client, server: Any, reporter: Any
) -> None:
    v2 = make_zip({"SKILL.md": skill_md("reporter", "Second edition.")})
    client.skills.versions.create(reporter.id, files=("v2.zip", v2))
    user = client.containers.create(
        name="user", skills=[{"type": "skill_reference", "skill_id": reporter.id, "version": "2"}]
    )
    bystander = client.containers.create(
        name="bystander", skills=[{"type": "skill_reference", "skill_id": reporter.id}]
    )
    vdir = skills_disk(server) / "versions" / reporter.id
    client.skills.versions.delete("2", skill_id=reporter.id)
    with pytest.raises(openai.NotFoundError):
        client.skills.versions.retrieve("2", skill_id=reporter.id)
    assert "Second edition." in run(http, user.id, "cat /mnt/skills/reporter/SKILL.md")[0]["stdout"]
    client.skills.delete(reporter.id)
    with pytest.raises(openai.NotFoundError):  # gone from the API at once
        client.containers.create(
            name="late", skills=[{"type": "skill_reference", "skill_id": reporter.id}]
        )
    out = run(http, user.id, "cat /mnt/skills/reporter/SKILL.md", "ls /mnt/skills/reporter")
    assert "Second edition." in out[0]["stdout"]
    out = run(http, bystander.id, "/mnt/skills/reporter/scripts/report.sh x")
    assert out[0]["stdout"] == "report for x\n"
    assert (vdir / "1").is_dir() and (vdir / "2").is_dir()
    client.containers.delete(user.id)
    assert not (vdir / "2").exists() and (vdir / "1").is_dir()  # the bystander still uses 1
    assert not (layouts(server) / f"{reporter.id}.2").exists()
    assert (layouts(server) / f"{reporter.id}.1").is_dir()
    client.containers.delete(bystander.id)
    assert not vdir.exists()
    assert not (layouts(server) / f"{reporter.id}.1").exists()


@pytest.fixture(scope="module")
def restartable(server_factory: Callable[..., Any]) -> Any:
    srv = server_factory(start=False)
    srv.env["SHELLBOX_TEST_KEY"] = srv.create_key("skills-restart")
    return srv.start()


def test_mounts_survive_a_restart_after_deletion(restartable: Any) -> None:
    key = restartable.env["SHELLBOX_TEST_KEY"]
    auth = {"authorization": f"Bearer {key}"}
    with openai.OpenAI(base_url=restartable.base_url, api_key=key, max_retries=0) as c:
        skill = c.skills.create(files=("r.zip", REPORTER))
        gone = c.skills.create(files=("g.zip", make_zip({"SKILL.md": skill_md("gone", "g")})))
        box = c.containers.create(
            name="keeps", skills=[{"type": "skill_reference", "skill_id": skill.id}]
        )
        c.skills.delete(skill.id)
        c.skills.delete(gone.id)
    # Leftovers a crash could leave: a half-done upload, and an orphan unpacked version.
    root = skills_disk(restartable)
    (root / "staging" / "tmp-crash").mkdir()
    orphan = root / "versions" / "skill_orphan" / "1"
    orphan.mkdir(parents=True)
    held_orphan = layouts(restartable) / "skill_orphan.1"  # and the runtime's copy of it
    held_orphan.mkdir()
    restartable.kill()
    restartable.start()
    assert not (root / "staging" / "tmp-crash").exists()
    assert not orphan.parent.exists()
    assert not held_orphan.exists()
    assert not (root / "versions" / gone.id).exists()
    assert (root / "versions" / skill.id / "1" / "files").is_dir()
    with httpx.Client(base_url=restartable.root_url, headers=auth, timeout=60) as h:
        out = run(h, box.id, "/mnt/skills/reporter/scripts/report.sh after-restart")
        assert out[0]["stdout"] == "report for after-restart\n"
        assert h.delete(f"/v1/containers/{box.id}").status_code == 200
    assert not (root / "versions" / skill.id).exists()
    assert not (layouts(restartable) / f"{skill.id}.1").exists()
