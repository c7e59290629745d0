"""Fixtures shared by every test: a real sandbox image, a state directory, a real runtime.

The image is built once into ``<repo>/.state/images`` (the test command builds it first) and
shared; each test session gets its own state directory, which must be traversable by the
containers' root uid, hence not under pytest's 0700 tmp_path.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.settings import Settings

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"


def make_state_dir(prefix: str = "shellbox-test-") -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    path = make_state_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(state_dir: Path) -> Settings:
    return Settings(state_dir=state_dir, runtime={"image_dir": IMAGE_DIR})


@pytest.fixture(scope="session")
async def runtime(settings: Settings) -> AsyncIterator[OciRuntime]:
    rt = create_runtime(settings)
    yield rt
    for info in await rt.list():
        await rt.destroy(info.id)


@pytest.fixture
async def container(runtime: OciRuntime) -> AsyncIterator[str]:
    """A started container, destroyed after the test."""
    cid = new_id("cntr_")
    await runtime.create(ContainerSpec(id=cid))
    await runtime.start(cid)
    yield cid
    await runtime.destroy(cid)
