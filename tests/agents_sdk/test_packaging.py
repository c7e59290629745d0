"""The Agents SDK integration is optional: the core never imports ``agents``."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = """
import json, sys
import shellbox, shellbox.app, shellbox.client, shellbox.cli, shellbox.services
from shellbox.app import create_app
from shellbox.settings import Settings
create_app(Settings())
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("agents", "openai"))))
"""


def test_core_and_client_do_not_import_the_agents_sdk() -> None:
    # A fresh interpreter: this test process has imported the SDK already.
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, cwd="/"
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], loaded  # not the Agents SDK, and not even openai (client.openai is lazy)


def test_the_integration_imports_with_the_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import shellbox.integrations.agents as a; print(a.__all__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    assert "ShellboxSandboxClient" in out.stdout
