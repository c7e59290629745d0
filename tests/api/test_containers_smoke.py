from __future__ import annotations

from typing import Any

import httpx


def test_create_run_echo(client: Any, http: httpx.Client) -> None:
    c = client.containers.create(name="smoke")
    assert c.status == "running"
    r = http.post(
        f"/v1/containers/{c.id}/calls",
        json={
            "type": "shell_call",
            "call_id": "call_1",
            "action": {"commands": ["echo hi > out.txt; cat out.txt"]},
        },
    )
    assert r.status_code == 200, r.text
    item = r.json()
    assert item["output"][0]["stdout"] == "hi\n"
    assert [f["filename"] for f in item["files"]] == ["out.txt"]
    content = client.containers.files.content.retrieve(
        item["files"][0]["file_id"], container_id=c.id
    )
    assert content.read() == b"hi\n"
    client.containers.delete(c.id)
