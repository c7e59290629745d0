"""shellbox.client for the container extensions: mounted skills and the egress audit."""

from __future__ import annotations

import base64
import io
import zipfile
from typing import Any

import pytest

from shellbox.client import AsyncShellbox, NotFoundError, Shellbox


def skill_zip(name: str, description: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(
            f"{name}/SKILL.md", f"---\nname: {name}\ndescription: {description}\n---\nUse.\n"
        )
    return buf.getvalue()


def test_mounted_skills(sb_sync: Shellbox, client: Any) -> None:
    skill = client.skills.create(
        files=("notes.zip", skill_zip("notes", "Keeps notes."), "application/zip")
    )
    inline = {
        "type": "inline",
        "name": "tally",
        "description": "Counts things.",
        "source": {
            "type": "base64",
            "media_type": "application/zip",
            "data": base64.b64encode(skill_zip("tally", "Counts things.")).decode(),
        },
    }
    c = client.containers.create(
        name="skills-client", skills=[{"type": "skill_reference", "skill_id": skill.id}, inline]
    )
    try:
        mounted = sb_sync.skills.list(c.id)
        by_name = {m["name"]: m for m in mounted}
        assert set(by_name) == {"notes", "tally"}
        assert by_name["notes"]["path"] == "/mnt/skills/notes"
        assert by_name["notes"]["skill_id"] == skill.id
        assert by_name["notes"]["version"] == "1"
        assert by_name["tally"]["type"] == "inline"
        assert by_name["tally"]["description"] == "Counts things."
    finally:
        client.containers.delete(c.id)
        client.skills.delete(skill.id)
    with pytest.raises(NotFoundError):
        sb_sync.skills.list(c.id)


FETCH = (
    'python3 -c "import urllib.request as u\n'
    "for h in ('blocked-{i}.example', 'other-{i}.example'):\n"
    "    try: u.urlopen('http://' + h + '/p?q=1', timeout=10)\n"
    '    except Exception as e: print(h, e)"'
)


async def test_egress_audit_pages(sb: AsyncShellbox) -> None:
    c = await sb.openai.containers.create(
        name="egress-client",
        network_policy={"type": "allowlist", "allowed_domains": ["allowed.example"]},
    )
    try:
        for i in range(3):
            await sb.calls.shell(c.id, [FETCH.format(i=i)], timeout_ms=30_000)
        first = await sb.egress.list(c.id, limit=4, order="asc")
        assert len(first.data) == 4 and first.has_more
        records = [r async for r in sb.egress.list_all(c.id, limit=4, order="asc")]
        assert [r["host"] for r in records] == [
            f"{kind}-{i}.example" for i in range(3) for kind in ("blocked", "other")
        ]
        assert {r["decision"] for r in records} == {"refused"}
        assert all(r["path"] == "/p" and r["method"] == "GET" for r in records)
        assert records[:4] == first.data
    finally:
        await sb.openai.containers.delete(c.id)
