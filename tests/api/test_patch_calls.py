"""apply_patch_call items through POST /v1/containers/{id}/calls, with the SDK's item shapes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest


@pytest.fixture
def cid(client: Any) -> Iterator[str]:
    c = client.containers.create(name="patch")
    yield c.id
    client.containers.delete(c.id)


def call(http: httpx.Client, cid: str, item: dict[str, Any]) -> dict[str, Any]:
    r = http.post(f"/v1/containers/{cid}/calls", json=item)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def shell(http: httpx.Client, cid: str, *commands: str) -> list[dict[str, Any]]:
    out = call(
        http, cid, {"type": "shell_call", "call_id": "c", "action": {"commands": list(commands)}}
    )
    return list(out["output"])


def patch(http: httpx.Client, cid: str, **fields: Any) -> dict[str, Any]:
    return call(
        http,
        cid,
        {"type": "apply_patch_call", "call_id": "call_p", "status": "completed", **fields},
    )


def test_create_update_delete(http: httpx.Client, cid: str, client: Any) -> None:
    out = patch(
        http,
        cid,
        operation={"type": "create_file", "path": "src/a.py", "diff": "+def f():\n+    return 1\n"},
    )
    assert out["type"] == "apply_patch_call_output"
    assert out["call_id"] == "call_p"
    assert (out["status"], out["output"]) == ("completed", "Created src/a.py")
    # As in the reference editor, a create diff's lines are joined without a final newline.
    [r] = shell(http, cid, "cat src/a.py; echo; stat -c '%u %a' src/a.py src")
    assert r["stdout"] == "def f():\n    return 1\n1000 644\n1000 755\n"

    out = patch(
        http,
        cid,
        operation={
            "type": "update_file",
            "path": "/mnt/data/src/a.py",
            "diff": "@@ def f():\n-    return 1\n+    return 2\n",
        },
    )
    assert (out["status"], out["output"]) == ("completed", "Updated /mnt/data/src/a.py")
    assert shell(http, cid, "cat src/a.py")[0]["stdout"] == "def f():\n    return 2"
    listed = {f.path: f for f in client.containers.files.list(cid)}
    assert "/mnt/data/src/a.py" in listed

    out = patch(http, cid, operation={"type": "delete_file", "path": "src/a.py"})
    assert (out["status"], out["output"]) == ("completed", "Deleted src/a.py")
    assert shell(http, cid, "test -e src/a.py; echo $?")[0]["stdout"] == "1\n"


def test_wrong_operation_says_which_to_use(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "echo x > a.txt")
    out = patch(http, cid, operation={"type": "create_file", "path": "a.txt", "diff": "+y\n"})
    assert out["status"] == "failed"
    assert "already exists" in out["output"] and "update_file" in out["output"]
    out = patch(
        http, cid, operation={"type": "update_file", "path": "nope.txt", "diff": "@@\n-a\n+b\n"}
    )
    assert out["status"] == "failed" and "create_file" in out["output"]
    out = patch(http, cid, operation={"type": "delete_file", "path": "nope.txt"})
    assert out["status"] == "failed" and "does not exist" in out["output"]


def test_context_error_names_hunk_and_nearest_line(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "printf 'alpha\\nbeta\\ngamma\\n' > g.txt")
    out = patch(
        http,
        cid,
        operation={"type": "update_file", "path": "g.txt", "diff": "@@\n alpha\n-betta\n+BETA\n"},
    )
    assert out["status"] == "failed"
    assert "betta" in out["output"] and "line 2" in out["output"]


def test_several_operations_are_atomic(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "echo keep > k.txt")
    out = patch(
        http,
        cid,
        operations=[
            {"type": "create_file", "path": "new.txt", "diff": "+new\n"},
            {"type": "update_file", "path": "k.txt", "diff": "@@\n-keep\n+changed\n"},
            {"type": "update_file", "path": "missing.txt", "diff": "@@\n-a\n+b\n"},
        ],
    )
    assert out["status"] == "failed"
    assert "operation 3" in out["output"] and "No changes were made" in out["output"]
    [r] = shell(http, cid, "cat k.txt; test -e new.txt; echo $?")
    assert r["stdout"] == "keep\n1\n"


def test_envelope_with_move(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "printf 'one\\ntwo\\n' > m.txt")
    envelope = (
        "*** Begin Patch\n*** Update File: m.txt\n*** Move to: moved/m2.txt\n@@\n one\n-two\n+2\n"
        "*** Add File: b.txt\n+bee\n*** End Patch\n"
    )
    out = patch(http, cid, patch=envelope)
    assert out["status"] == "completed", out["output"]
    assert out["output"] == "Updated m.txt\nMoved m.txt to moved/m2.txt\nCreated b.txt"
    [r] = shell(http, cid, "cat moved/m2.txt b.txt; test -e m.txt; echo $?")
    assert r["stdout"] == "one\n2\nbee1\n"


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x", "/mnt/data/../x"])
def test_path_escapes_fail_cleanly(http: httpx.Client, cid: str, path: str) -> None:
    out = patch(http, cid, operation={"type": "create_file", "path": path, "diff": "+x\n"})
    assert out["status"] == "failed"
    assert "/mnt/data" in out["output"]


def test_symlinks_out_of_data_fail(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "ln -s /etc/passwd pw; ln -s /etc linkdir")
    out = patch(
        http, cid, operation={"type": "update_file", "path": "pw", "diff": "@@\n-root\n+owned\n"}
    )
    assert out["status"] == "failed" and "symbolic link" in out["output"]
    out = patch(
        http, cid, operation={"type": "create_file", "path": "linkdir/evil", "diff": "+x\n"}
    )
    assert out["status"] == "failed"
    out = patch(http, cid, operation={"type": "delete_file", "path": "pw"})
    assert out["status"] == "failed"
    # Through a planted link, an existing and a missing host directory look the same: the
    # walk refuses the link itself, so nothing about the host's paths leaks into the message.
    for host_dir in ("ssl", "no-such-dir"):
        out = patch(
            http,
            cid,
            operation={"type": "create_file", "path": f"linkdir/{host_dir}/x", "diff": "+x\n"},
        )
        assert out["status"] == "failed" and "symbolic link" in out["output"], out["output"]


def test_sandbox_permissions_apply(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "echo ro > ro.txt; chmod 444 ro.txt; mkdir lock; chmod 555 lock")
    out = patch(
        http, cid, operation={"type": "update_file", "path": "ro.txt", "diff": "@@\n-ro\n+rw\n"}
    )
    assert out["status"] == "failed" and "permission denied" in out["output"]
    out = patch(http, cid, operation={"type": "create_file", "path": "lock/x", "diff": "+x\n"})
    assert out["status"] == "failed" and "permission denied" in out["output"]


def test_patched_files_show_in_next_call(http: httpx.Client, cid: str) -> None:
    patch(http, cid, operation={"type": "create_file", "path": "p.txt", "diff": "+p\n"})
    out = call(
        http,
        cid,
        {"type": "shell_call", "call_id": "c", "action": {"commands": ["echo q >> p.txt"]}},
    )
    assert [f["filename"] for f in out["files"]] == ["p.txt"]


def test_malformed_item_is_400(http: httpx.Client, cid: str) -> None:
    r = http.post(f"/v1/containers/{cid}/calls", json={"type": "apply_patch_call", "call_id": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "operation"
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={
            "type": "apply_patch_call",
            "call_id": "x",
            "operation": {"type": "rename_file", "path": "a"},
        },
    )
    assert r.status_code == 400


def test_cli_patch_applies_an_envelope(
    http: httpx.Client, cid: str, server: Any, tmp_path: Any
) -> None:
    shell(http, cid, "printf 'a\\nb\\n' > cli.txt")
    good = tmp_path / "good.patch"
    good.write_text("*** Begin Patch\n*** Update File: cli.txt\n@@\n a\n-b\n+B\n*** End Patch\n")
    assert server.shellbox("patch", str(good), "--container", cid) == "Updated cli.txt"
    assert shell(http, cid, "cat cli.txt")[0]["stdout"] == "a\nB\n"
    bad = tmp_path / "bad.patch"
    bad.write_text("*** Begin Patch\n*** Delete File: nope.txt\n*** End Patch\n")
    with pytest.raises(subprocess.CalledProcessError) as info:
        server.shellbox("patch", str(bad), "--container", cid)
    assert info.value.returncode == 1
    assert "does not exist" in info.value.stderr
