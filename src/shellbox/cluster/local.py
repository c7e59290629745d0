"""A whole cluster on this one machine (``scripts/cluster.sh``, the cluster tests, the bench):
PostgreSQL (Debian's, in a temporary data directory, reached by its Unix socket), sandbox
nodes (``shellbox node``, each on its own state directory, sharing the built images), API
replicas (``shellbox serve --role api``) and HAProxy round-robin in front of them on one port.

Every piece is a child process of this one (PostgreSQL: the daemon ``pg_ctl`` starts), with
its log in the cluster's directory; ``stop`` ends them all, and a node or replica can be killed
and started again on its own state directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PG_BIN = Path(os.environ.get("SHELLBOX_PG_BIN", "/usr/lib/postgresql/15/bin"))
HAPROXY = os.environ.get("SHELLBOX_HAPROXY", "/usr/sbin/haproxy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: its files belong to Debian's ``postgres`` user.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Child:
    """One process of the cluster, restartable with the same arguments."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    health_url: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90) -> Child:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # a Ctrl-C of the terminal reaches us, not them
            )
        if self.health_url is not None:
            deadline = time.monotonic() + timeout_s
            while not _healthy(self.health_url):
                if self.proc.poll() is not None:
                    msg = f"{self.name} exited: {self.log()}"
                    raise RuntimeError(msg)
                if time.monotonic() > deadline:
                    msg = f"{self.name} did not become healthy: {self.log()}"
                    raise RuntimeError(msg)
                time.sleep(0.1)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s: float = 30) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""


@dataclass
class LocalCluster:
    root: Path  # logs, the key, the nodes' and replicas' state directories
    image_dir: Path
    nodes: int = 2
    replicas: int = 2
    port: int = 0  # HAProxy's (0: a free one)
    env: dict[str, str] = field(default_factory=dict)  # SHELLBOX_* for every node and replica
    node_memory_gb: float | None = None
    children: dict[str, Child] = field(default_factory=dict)
    database_url: str = ""
    pg_dir: Path | None = None

    @property
    def key_file(self) -> Path:
        return self.root / "cluster.key"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def node(self, i: int) -> Child:
        return self.children[f"node{i}"]

    def replica(self, i: int) -> Child:
        return self.children[f"api{i}"]

    def replica_url(self, i: int) -> str:
        return str(self.replica(i).health_url).removesuffix("/healthz")

    def start(self) -> LocalCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # the containers' root uids traverse the state dirs below
        try:
            self._postgres()
            fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
            self.shellbox("db", "upgrade")
            for i in range(1, self.nodes + 1):
                self._node(i).start()
            for i in range(1, self.replicas + 1):
                self._replica(i).start()
            self._haproxy().start()
        except BaseException:
            self.stop()
            raise
        return self

    def _env(self) -> dict[str, str]:
        return {
            "SHELLBOX_RUNTIME__IMAGE_DIR": str(self.image_dir),
            "SHELLBOX_STORE__DATABASE_URL": self.database_url,
            # domain_secrets are sealed in the database with this key: one for all replicas
            "SHELLBOX_EGRESS__SECRETS_KEY_FILE": str(self.root / "secrets.key"),
            **self.env,
        }

    def shellbox(self, *args: str) -> str:
        """A ``shellbox`` command against the cluster's database (``keys create``...)."""
        out = subprocess.run(
            [sys.executable, "-m", "shellbox.cli", *args, "--state-dir", str(self.root / "cli")],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **self._env()},
        )
        return out.stdout.strip()

    # -- the pieces -----------------------------------------------------------------------------

    def _postgres(self) -> None:
        pg = self.root / "postgres"
        pg.mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(pg, owner.pw_uid, owner.pw_gid)
        subprocess.run(
            _as_postgres(
                [
                    *(str(PG_BIN / "initdb"), "-D", str(pg / "data"), "-U", "postgres"),
                    *("-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C.UTF-8"),
                ]
            ),
            check=True,
            capture_output=True,
        )
        # Reached by its Unix socket in that directory only: no TCP port.
        options = (
            f"-k {pg} -c listen_addresses='' -c max_connections=300 -c fsync=off "
            "-c shared_buffers=32MB -c synchronous_commit=off"
        )
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(pg / "data"), "-o", options]
        log = str(pg / "server.log")  # (written by the postgres user: in its own directory)
        subprocess.run(
            _as_postgres([*pg_ctl, "-l", log, "-w", "-t", "60", "start"]),
            check=True,
            capture_output=True,
        )
        self.pg_dir = pg
        self.database_url = f"postgresql+psycopg://postgres@/postgres?host={pg}&port=5432"

    def _node(self, i: int) -> Child:
        port = free_port()
        state = self.root / f"node{i}"
        state.mkdir(exist_ok=True)
        state.chmod(0o711)
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "shellbox.cli", "node", "--state-dir", str(state)]
        argv += ["--listen", f"127.0.0.1:{port}", "--cluster-key-file", str(self.key_file)]
        argv += ["--database-url", self.database_url, "--advertise", url, "--name", f"node{i}"]
        env = self._env()
        if self.node_memory_gb is not None:
            env["SHELLBOX_CLUSTER__NODE_MEMORY_GB"] = str(self.node_memory_gb)
        child = Child(f"node{i}", argv, self.root / f"node{i}.log", env, f"{url}/healthz")
        self.children[child.name] = child
        return child

    def _replica(self, i: int) -> Child:
        port = free_port()
        state = self.root / f"api{i}"
        state.mkdir(exist_ok=True)
        argv = [sys.executable, "-m", "shellbox.cli", "serve", "--role", "api"]
        argv += ["--state-dir", str(state), "--port", str(port)]
        argv += ["--cluster-key-file", str(self.key_file)]
        url = f"http://127.0.0.1:{port}"
        child = Child(f"api{i}", argv, self.root / f"api{i}.log", self._env(), f"{url}/healthz")
        self.children[child.name] = child
        return child

    def _haproxy(self) -> Child:
        self.port = self.port or free_port()
        servers = "\n".join(
            f"  server api{i} {self.replica_url(i).removeprefix('http://')} "
            "check inter 500ms fall 2 rise 1"
            for i in range(1, self.replicas + 1)
        )
        # Round-robin per request. A request that cannot reach its replica (refused: it
        # died) is sent to the other (``retry-on conn-failure``, ``redispatch``); health
        # checks take a dead replica out within a second. A client that leaves closes the
        # replica's connection at once (``abortonclose``), even while the response is silent
        # (a streamed call whose command prints nothing): else HAProxy only notices when it
        # next writes, and the replica, and through it the node, run the command on.
        config = f"""global
  maxconn 2000
defaults
  mode http
  timeout connect 2s
  timeout client 15m
  timeout server 15m
  retries 3
  retry-on conn-failure empty-response
  option redispatch 1
  option abortonclose
frontend shellbox
  bind 127.0.0.1:{self.port}
  default_backend replicas
backend replicas
  balance roundrobin
  option httpchk GET /healthz
{servers}
"""
        path = self.root / "haproxy.cfg"
        path.write_text(config)
        argv = [HAPROXY, "-db", "-f", str(path)]
        child = Child("haproxy", argv, self.root / "haproxy.log", {}, f"{self.root_url}/healthz")
        self.children["haproxy"] = child
        return child

    def destroy_sandboxes(self) -> None:
        """Destroy every container of every node (before a ``stop`` that is followed by
        removing the directory: a stopped node leaves its containers as they are, to take
        them back when it starts again). A running node destroys its own, through its API;
        for a node that is not running (killed, or it exited) its own runtime does it over
        its state directory (``shellbox.cluster.teardown``): else its containers' processes
        and cgroups would outlive the directory. Raises when one could not be destroyed,
        before anything is removed."""
        import asyncio

        from shellbox.sandbox.remote import RemoteRuntime, load_cluster_key

        async def clear(url: str, key: str) -> None:
            node = RemoteRuntime(url, key)
            try:
                for info in await node.list():
                    await node.destroy(info.id)
            finally:
                await node.aclose()

        key = load_cluster_key(self.key_file)
        for name, child in self.children.items():
            if not name.startswith("node"):
                continue
            if child.alive() and child.health_url:
                asyncio.run(clear(child.health_url.removesuffix("/healthz"), key))
            elif (self.root / name).is_dir():
                self._destroy_left(child)

    def _destroy_left(self, node: Child) -> None:
        argv = [sys.executable, "-m", "shellbox.cluster.teardown", str(self.root / node.name)]
        done = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **node.env}, check=False
        )
        with open(node.log_path, "a") as log:  # what it destroyed, with the node's own log
            log.write(done.stdout + done.stderr)
        if done.returncode != 0:
            msg = f"destroying the containers {node.name} left failed: {done.stderr[-2000:]}"
            raise RuntimeError(msg)

    def stop(self) -> None:
        """Everything, front first; PostgreSQL last (the others deregister through it)."""
        order = ["haproxy", *[n for n in self.children if n.startswith("api")]]
        order += [n for n in self.children if n.startswith("node")]
        for name in order:
            if name in self.children:
                self.children[name].stop()
        if self.pg_dir is not None:  # immediate: nothing in it is worth keeping
            pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir / "data")]
            subprocess.run(_as_postgres([*pg_ctl, "-m", "immediate", "stop"]), capture_output=True)
            self.pg_dir = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cluster.sh", description="PostgreSQL, sandbox nodes, API replicas and HAProxy"
    )
    parser.add_argument("--port", type=int, default=8000, help="HAProxy's port (default 8000)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--image-dir", type=Path, required=True)
    parser.add_argument("--dir", type=Path, help="where everything lives (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the directory after stopping")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="shellbox-cluster-", dir="/var/tmp"))
    cluster = LocalCluster(
        root, args.image_dir.resolve(), nodes=args.nodes, replicas=args.replicas, port=args.port
    )
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        print(f"shellbox cluster up: {cluster.base_url} (HAProxy, round-robin over", end=" ")
        print(f"{args.replicas} API replicas; {args.nodes} nodes; PostgreSQL)", flush=True)
        print(f"  database: {cluster.database_url}", flush=True)
        print(f"  logs and state: {root}; Ctrl-C stops everything", flush=True)
        while not stopping:
            dead = [c.name for c in cluster.children.values() if not c.alive()]
            if dead:
                print(f"cluster.sh: {', '.join(dead)} exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        # A container that could not be destroyed keeps the directory (and the error is
        # raised, with its cause): removing it under running containers leaks them for good.
        cleared = False
        try:
            if not args.keep and cluster.key_file.exists():
                cluster.destroy_sandboxes()
            cleared = True
        finally:
            cluster.stop()
            if not args.keep and cleared:
                for child in cluster.children.values():
                    if child.name.startswith("node"):
                        _unmount_disks(root / child.name)
                shutil.rmtree(root, ignore_errors=True)
            elif not args.keep:
                print(f"cluster.sh: containers are left; keeping {root}", file=sys.stderr)
            print("cluster.sh: stopped", flush=True)


def _unmount_disks(state: Path) -> None:
    """A node's containers' disks are mounted in its own mount namespace, gone with it; what
    this namespace may hold of them (a loop device) goes too."""
    from shellbox.sandbox import hostns

    hostns.detach(str(state / "disks"))


if __name__ == "__main__":
    sys.exit(main())
