"""Fixtures for the sandbox tests (real containers, no mocks).

``oci`` is a runtime per OCI binary (crun, and runc as the fallback): the semantics suite
runs against both. ``box`` is a fresh started container of that runtime.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir

from node_helpers import NodeProcess
from process_helpers import destroy_all_sandboxes
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.settings import Settings

BINARIES = ("crun", "runc")


@pytest.fixture(scope="session", params=BINARIES)
async def oci(request: pytest.FixtureRequest) -> AsyncIterator[OciRuntime]:
    """A runtime per OCI binary, each on its own state directory."""
    binary = request.param
    if shutil.which(binary) is None:  # setup.sh installs both; say so loudly if not
        pytest.fail(f"{binary} is not installed: run ./scripts/setup.sh")
    state = make_state_dir(f"shellbox-{binary}-")
    rt = create_runtime(Settings(state_dir=state, runtime={"image_dir": IMAGE_DIR, "type": binary}))
    yield rt
    for info in await rt.list():
        await rt.destroy(info.id)
    remove_state_dir(state)


@pytest.fixture(scope="session")
def node(oci: OciRuntime) -> Iterator[NodeProcess]:
    """A ``shellbox node`` subprocess on the ``oci`` fixture's binary, its own state directory
    and a loopback port: the runtime contract suite runs against it through ``RemoteRuntime``."""
    state = make_state_dir(f"shellbox-node-{oci.binary}-")
    proc = NodeProcess(state, env={"SHELLBOX_RUNTIME__TYPE": oci.binary}).start()
    yield proc
    proc.stop()
    destroy_all_sandboxes(state)  # a test may have killed it: through a runtime of this process
    remove_state_dir(state)


@pytest.fixture
async def box(oci: OciRuntime) -> AsyncIterator[str]:
    """A started container of the ``oci`` runtime, destroyed after the test."""
    cid = new_id("cntr_")
    await oci.create(ContainerSpec(id=cid))
    await oci.start(cid)
    yield cid
    await oci.destroy(cid)


@pytest.fixture
def marker() -> str:
    """A number no other process on the host has in its command line (``sleep <marker>``)."""
    return f"{7000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**9}"


@pytest.fixture
def host_state_dir() -> Iterator[Path]:
    path = make_state_dir()
    yield path
    remove_state_dir(path)
