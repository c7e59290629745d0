"""shellbox under the OpenAI Agents SDK, three ways (``pip install shellbox[agents]``):

* ``ShellTool(executor=ShellboxShellExecutor(box))`` and
  ``LocalShellTool(executor=ShellboxLocalShellExecutor(box))``: the model's shell calls run in
  a shellbox container instead of on your machine;
* ``ApplyPatchTool(editor=ShellboxEditor(box))``: its V4A patches are applied there too;
* ``SandboxRunConfig(client=ShellboxSandboxClient(), options=ShellboxSandboxClientOptions())``:
  a ``SandboxAgent`` gets a shellbox container as its sandbox (exec, files, snapshots).

``box = ShellboxContainer(base_url=..., api_key=...)`` is shared by the first two; it creates
its container on first use (or takes ``container_id=``) and deletes what it created on
``aclose()``.
"""

from __future__ import annotations

from shellbox.integrations.agents.container import ShellboxContainer
from shellbox.integrations.agents.editor import ApplyPatchFailed, ShellboxEditor
from shellbox.integrations.agents.sandbox import (
    ShellboxSandboxClient,
    ShellboxSandboxClientOptions,
    ShellboxSandboxSession,
    ShellboxSandboxSessionState,
)
from shellbox.integrations.agents.shell import ShellboxLocalShellExecutor, ShellboxShellExecutor

__all__ = [
    "ApplyPatchFailed",
    "ShellboxContainer",
    "ShellboxEditor",
    "ShellboxLocalShellExecutor",
    "ShellboxSandboxClient",
    "ShellboxSandboxClientOptions",
    "ShellboxSandboxSession",
    "ShellboxSandboxSessionState",
    "ShellboxShellExecutor",
]
