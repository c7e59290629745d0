"""The Agents SDK's own sandbox path contract, from its integration-test helpers (copied in
``openai_agents_helpers``), held against the shellbox provider: a path or a symbolic link
that leads out of the workspace is refused with the SDK's errors (InvalidManifestPathError,
or ApplyPatchPathError for patches), as its Docker provider refuses them; a link that stays
inside the workspace is followed, and a write goes to its target, as with Docker.

The server makes the decision (the provider only maps its ``path_outside_workspace``
error), so a link planted by the sandbox cannot be used by any client either."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai_agents_helpers as sdk_helpers
import pytest
from agents.editor import ApplyPatchOperation
from agents.sandbox import LocalSnapshotSpec
from agents.sandbox.errors import InvalidManifestPathError

from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import ShellboxSandboxClient, ShellboxSandboxClientOptions

PASSWD = Path("/etc/passwd")


@pytest.fixture
async def session(sb: AsyncShellbox, tmp_path: Path) -> AsyncIterator[Any]:
    client = ShellboxSandboxClient(sb)
    s = await client.create(
        options=ShellboxSandboxClientOptions(name="path-contract"),
        snapshot=LocalSnapshotSpec(base_path=tmp_path),
    )
    await s.start()
    try:
        yield s
    finally:
        await s.aclose()


async def _sh(session: Any, script: str) -> str:
    out = await session.exec(script, timeout=30)
    assert out.exit_code == 0, out.stderr
    return str(out.stdout.decode())


async def test_paths_and_links_that_lead_out_are_refused_with_the_sdk_errors(
    session: Any,
) -> None:
    passwd = hashlib.sha256(PASSWD.read_bytes()).hexdigest()
    for path in ("../outside.txt", "/tmp/sandbox-outside.txt"):
        await sdk_helpers._assert_read_blocked(session, path)
        await sdk_helpers._assert_write_blocked(session, path)
        await sdk_helpers._assert_patch_blocked(session, path)
    # Links the sandbox makes, by every spelling that leads out: absolute, relative, through
    # a linked directory, '..' after /mnt/data, up from a subdirectory, a link to a link.
    await _sh(
        session,
        "echo secret > /tmp/outside.txt && ln -s /etc/passwd abs.txt"
        " && ln -s ../../tmp/outside.txt rel.txt && ln -s /tmp tmpdir"
        " && ln -s /mnt/data/../../tmp/outside.txt sneaky.txt && mkdir d && ln -s ../.. d/up"
        " && ln -s abs.txt chain.txt",
    )
    for link in ("abs.txt", "rel.txt", "tmpdir/outside.txt", "sneaky.txt", "d/up/tmp/outside.txt"):
        await sdk_helpers._assert_read_blocked(session, link)
        await sdk_helpers._assert_write_blocked(session, link)
        await sdk_helpers._assert_patch_blocked(session, link)
    await sdk_helpers._assert_read_blocked(session, "chain.txt")
    # The SDK's command-based operations check the path first, as with Docker.
    for operation in (
        session.ls("tmpdir"),
        session.mkdir("tmpdir/new", parents=True),
        session.rm("d/up/tmp/outside.txt"),
        session.mv("abs.txt", "moved.txt"),
    ):
        with pytest.raises(InvalidManifestPathError):
            await operation
    # Refused, not replaced: the links are still links, and nothing outside changed.
    out = await _sh(
        session, "cat /tmp/outside.txt; for l in abs rel sneaky; do test -L $l.txt; done"
    )
    assert out == "secret\n"
    assert hashlib.sha256(PASSWD.read_bytes()).hexdigest() == passwd


async def test_links_inside_the_workspace_are_followed_like_docker(session: Any) -> None:
    await _sh(
        session,
        "echo v1 > real.txt && ln -s real.txt inner.txt && ln -s /mnt/data/real.txt abs.txt"
        " && mkdir sub && ln -s sub subdir && ln -s sub/new.txt dangling.txt",
    )
    assert await sdk_helpers.read_workspace_text(session, "inner.txt") == "v1\n"
    await sdk_helpers.write_workspace_text(session, "inner.txt", "v2\n")
    await sdk_helpers.write_workspace_text(session, "abs.txt", "v3\n")
    await session.apply_patch(
        ApplyPatchOperation(type="update_file", path="inner.txt", diff="@@\n-v3\n+v4\n")
    )
    await session.apply_patch(
        ApplyPatchOperation(type="create_file", path="dangling.txt", diff="+made\n")
    )
    await sdk_helpers.write_workspace_text(session, "subdir/x.txt", "x\n")
    out = await _sh(
        session,
        # (a created file's lines are joined without a final newline, as in the SDK)
        "cat real.txt sub/new.txt && echo && cat sub/x.txt && test -L inner.txt && test -L abs.txt"
        " && test -L dangling.txt && echo links",
    )
    assert out == "v4\nmade\nx\nlinks\n"


# The SDK helper makes its link on the local file system at the manifest root (/mnt/data)
# and its target beside it, as for a provider whose workspace is reachable locally. So it runs
# in a process of its own, in a private mount namespace where /mnt/data is the container's
# data directory: the link the helper makes is then a link in the container's workspace. That
# namespace is a copy of the server's, where the containers' disks are mounted (storage.py).
VERBATIM = textwrap.dedent(
    """
    import asyncio, subprocess, sys
    from pathlib import Path

    import openai_agents_helpers as sdk_helpers
    from agents import set_tracing_disabled
    from agents.sandbox import LocalSnapshotSpec

    from shellbox.client import AsyncShellbox
    from shellbox.integrations.agents import ShellboxSandboxClient, ShellboxSandboxClientOptions


    async def main(base_url: str, key: str, state_dir: str, snapshots: str) -> None:
        set_tracing_disabled(True)
        subprocess.run(["mount", "-t", "tmpfs", "shellbox-test", "/mnt"], check=True)
        Path("/mnt/data").mkdir()
        async with AsyncShellbox(base_url, key) as sb:
            session = await ShellboxSandboxClient(sb).create(
                options=ShellboxSandboxClientOptions(name="sdk-helpers"),
                snapshot=LocalSnapshotSpec(base_path=Path(snapshots)),
            )
            await session.start()
            try:
                cid = session.state.container_id
                data = Path(state_dir) / "disks" / cid / "data"
                subprocess.run(["mount", "--bind", str(data), "/mnt/data"], check=True)
                await sdk_helpers.assert_workspace_escape_blocked(session)
                out = await session.exec("ls -A /mnt/data", timeout=30)
                print("left:", out.stdout.decode().split())
            finally:
                await session.aclose()


    asyncio.run(main(*sys.argv[1:]))
    """
)


def test_the_sdk_escape_helpers_verbatim(server: Any, api_key: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    args = [server.base_url, api_key, str(server.state_dir), str(tmp_path)]
    out = subprocess.run(
        [
            *("nsenter", f"--mount={server.mount_namespace()}"),
            *("unshare", "--mount", "--propagation", "private"),
            *(sys.executable, "-c", VERBATIM, *args),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    # The helper removed its link again, and nothing was written in its place.
    assert out.stdout.strip() == "left: []", out.stdout
