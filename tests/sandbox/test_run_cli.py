"""``shellbox run``: one shell_call_output item as JSON; ``--keep`` and ``--container``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

from sandbox_helpers import IMAGE_DIR, REPO

from shellbox.sandbox import create_runtime
from shellbox.settings import Settings

SHELLBOX = REPO / ".venv" / "bin" / "shellbox"


def shellbox(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHELLBOX_RUNTIME__IMAGE_DIR": str(IMAGE_DIR)}
    env.pop("SHELLBOX_CONFIG", None)
    return subprocess.run(
        [str(SHELLBOX), "run", "--state-dir", str(state), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_run_prints_one_shell_call_output_item(host_state_dir: Path) -> None:
    p = shellbox(
        host_state_dir, "--timeout-ms", "5000", "--max-output-length", "5", "--",
        "echo hello world", "echo oops >&2; exit 3", "sleep 10",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    item = json.loads(p.stdout)
    assert item["type"] == "shell_call_output"
    assert item["status"] == "completed"
    assert item["call_id"].startswith("call_")
    assert item["max_output_length"] == 5
    assert item["output"][0] == {
        "stdout": "hello", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}
    }  # fmt: skip
    assert item["output"][1]["outcome"] == {"type": "exit", "exit_code": 3}
    assert item["output"][1]["stderr"] == "oops\n"
    assert item["output"][2]["outcome"] == {"type": "timeout"}
    # the throwaway container is gone
    assert list((host_state_dir / "containers").iterdir()) == []


def test_keep_then_container_persists_files(host_state_dir: Path) -> None:
    p = shellbox(host_state_dir, "--keep", "--", "echo persisted > a.txt")
    assert p.returncode == 0, p.stderr
    cid = p.stdout.strip()
    assert cid.startswith("cntr_")
    assert json.loads(p.stderr)["output"][0]["outcome"]["exit_code"] == 0
    try:
        p = shellbox(host_state_dir, "--container", cid, "--", "cat a.txt", "echo more >> a.txt")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["output"][0]["stdout"] == "persisted\n"
        p = shellbox(host_state_dir, "--container", cid, "--", "cat a.txt")
        assert json.loads(p.stdout)["output"][0]["stdout"] == "persisted\nmore\n"
    finally:
        rt = create_runtime(Settings(state_dir=host_state_dir, runtime={"image_dir": IMAGE_DIR}))
        asyncio.run(rt.destroy(cid))


def test_run_rejects_bad_input_with_a_clear_message(host_state_dir: Path) -> None:
    p = shellbox(host_state_dir, "--")
    assert p.returncode == 2
    assert "commands is empty" in p.stderr
    p = shellbox(host_state_dir, "--container", "cntr_nope", "--", "true")
    assert p.returncode == 2
    assert "no such container" in p.stderr
