"""Fixtures shared by every test: a real sandbox image, a state directory, a real runtime.

The image is built once into ``<repo>/.state/images`` (the test command builds it first) and
shared; each test session gets its own state directory, which must be traversable by the
containers' root uid, hence not under pytest's 0700 tmp_path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cluster_lane as lane
import pg_helpers as postgres
from process_helpers import (
    START_TIMEOUT_S,
    ChildProcess,
    destroy_all_sandboxes,
    free_port,
    make_state_dir,
    remove_state_dir,
)
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.settings import Settings

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    path = make_state_dir()
    yield path
    remove_state_dir(path)  # and its volatile directory (OCI state, sockets) in /run


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


# -- a real server on a loopback port ----------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import httpx  # noqa: E402


@dataclass
class ServerProcess(ChildProcess):
    """``shellbox serve`` in a subprocess, on its own state directory and loopback port."""

    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    cluster: postgres.Cluster | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shellbox(self, *args: str) -> str:
        """Run a ``shellbox`` CLI command against this server's state directory."""
        out = subprocess.run(
            [sys.executable, "-m", "shellbox.cli", *args, "--state-dir", str(self.state_dir)],
            check=True,
            capture_output=True,
            text=True,
            env=self._env(),
        )
        return out.stdout.strip()

    def create_key(self, project: str) -> str:
        return self.shellbox("keys", "create", "--project", project)

    @property
    def database_url(self) -> str:
        """The server's database: its own PostgreSQL database in the PostgreSQL lane."""
        default = f"sqlite:///{self.state_dir / 'private' / 'shellbox.db'}"
        return self.env.get("SHELLBOX_STORE__DATABASE_URL", default)

    def database_bytes(self) -> bytes:
        """Everything the database holds, as bytes (the SQLite files, or a ``pg_dump``)."""
        if self.database_url.startswith("sqlite"):
            return b"".join(p.read_bytes() for p in (self.state_dir / "private").glob("*.db*"))
        assert self.cluster is not None
        return self.cluster.dump(self.database_url)

    def cli_env(self) -> dict[str, str]:
        """The environment for a ``shellbox`` command run against this server's store."""
        return self._env()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SHELLBOX_RUNTIME__IMAGE_DIR"] = str(IMAGE_DIR)
        env.update(self.env)
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ServerProcess:
        self.log_path = self.state_dir / f"server-{self.port}.log"
        argv = [sys.executable, "-m", "shellbox.cli", "serve", "--state-dir",
                str(self.state_dir), "--port", str(self.port), *self.args]  # fmt: skip
        self.launch(argv, self._env(), self.log_path, f"{self.root_url}/healthz", timeout_s)
        return self

    def view(self, path: Path) -> Path:
        """``path`` as the server sees it: the containers' disks are mounted in its own mount
        namespace only (``storage.py``)."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root") / path.relative_to("/")

    def mount_namespace(self) -> str:
        """The server's mount namespace, for ``nsenter --mount=``: the one where the containers'
        disks are mounted."""
        assert self.proc is not None
        return f"/proc/{self.proc.pid}/ns/mnt"

    def data_dir(self, cid: str) -> Path:
        """Where the server keeps a container's /mnt/data (a path in its mount namespace)."""
        return self.state_dir / "disks" / cid / "data"

    def log(self) -> str:
        return self.log_path.read_text()[-5000:] if self.log_path else ""


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[postgres.Cluster]:
    """A throwaway PostgreSQL cluster for the session (each test takes a fresh database)."""
    if not postgres.available():
        pytest.fail(f"PostgreSQL is not installed in {postgres.PG_BIN}: run ./scripts/setup.sh")
    cluster = postgres.start_cluster()
    yield cluster
    cluster.stop()


def postgres_lane() -> bool:
    """Whether this run is the PostgreSQL lane of the API tests (scripts/test.sh)."""
    return os.environ.get(postgres.LANE_ENV, "sqlite") == "postgresql"


@pytest.fixture(scope="session")
def server_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., ServerProcess]]:
    """Start extra servers (own state dir), e.g. with short lifecycle settings via ``env``.
    In the PostgreSQL lane each server gets a fresh database of the session's cluster."""
    started: list[ServerProcess] = []

    def make(
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        state_dir: Path | None = None,
        start: bool = True,
    ) -> ServerProcess:
        server = ServerProcess(state_dir or make_state_dir("shellbox-srv-"), env or {}, args or [])
        if postgres_lane() and "SHELLBOX_STORE__DATABASE_URL" not in server.env:
            server.cluster = request.getfixturevalue("pg_cluster")
            server.env["SHELLBOX_STORE__DATABASE_URL"] = server.cluster.new_database()
        started.append(server)
        return server.start() if start else server

    yield make
    for server in started:  # all stop, whatever a clean-up below raises
        server.stop()
    failures: list[Exception] = []
    for server in started:
        try:
            destroy_all_sandboxes(server.state_dir)
        except Exception as exc:  # the other servers are still cleaned; raised below
            failures.append(exc)
            continue  # its state directory is kept, to look at
        remove_state_dir(server.state_dir)
    if failures:
        raise failures[0]


@pytest.fixture(scope="session")
def server(server_factory: Callable[..., ServerProcess], request: pytest.FixtureRequest) -> Any:
    """The shared server: API keys exist, so only real keys work (project 'test'). In the
    cluster lane (SHELLBOX_TEST_CLUSTER=1), a local cluster behind HAProxy."""
    if lane.cluster_lane():
        remote = lane.ClusterServer(request.getfixturevalue("local_cluster"))
        remote.env["SHELLBOX_TEST_KEY"] = remote.create_key("test")
        return remote
    srv = server_factory(start=False)
    srv.env["SHELLBOX_TEST_KEY"] = srv.create_key("test")
    return srv.start()


@pytest.fixture(scope="session")
def api_key(server: ServerProcess) -> str:
    return server.env["SHELLBOX_TEST_KEY"]


@pytest.fixture(scope="session")
def client(server: ServerProcess, api_key: str) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)


@pytest.fixture(scope="session")
def http(server: ServerProcess, api_key: str) -> Iterator[httpx.Client]:
    """A plain HTTP client for what the SDK does not cover (calls, raw error bodies)."""
    with httpx.Client(
        base_url=server.root_url, timeout=120, headers={"authorization": f"Bearer {api_key}"}
    ) as c:
        yield c


# -- the API suite against a local cluster (cluster_lane.py) -----------------------------------


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Any]:
    """A cluster for the session: PostgreSQL, nodes node1 and node2, replicas api1 and api2,
    HAProxy."""
    cluster = lane.start_local_cluster("shellbox-cluster-")
    try:
        yield cluster
    finally:
        lane.remove_local_cluster(cluster)
