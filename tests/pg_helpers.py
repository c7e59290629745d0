"""A throwaway PostgreSQL cluster for tests: ``initdb`` in a temporary directory, started on a
Unix socket in that directory (no TCP port), torn down afterwards.

PostgreSQL refuses to run as root: as root, the cluster belongs to the ``postgres`` system
user that Debian's package creates, and its commands run through ``runuser``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import make_url

PG_BIN = Path(os.environ.get("SHELLBOX_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
LANE_ENV = "SHELLBOX_TEST_DATABASE"  # "postgresql": the API lane runs on PostgreSQL


def available() -> bool:
    return (PG_BIN / "initdb").exists()


def _as_owner(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@dataclass
class Cluster:
    root: Path
    port: int = 5432  # only names the socket file: the cluster listens on no TCP port

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={self.port}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [
                str(PG_BIN / "psql"),
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-Atc",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def dump(self, url: str) -> bytes:
        """Everything a database holds, as ``pg_dump`` writes it."""
        database = str(make_url(url).database)
        return subprocess.run(
            [
                str(PG_BIN / "pg_dump"),
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                database,
            ],
            check=True,
            capture_output=True,
        ).stdout

    def stop(self) -> None:
        subprocess.run(
            _as_owner([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> Cluster:
    root = Path(tempfile.mkdtemp(prefix="shellbox-pg-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    cluster = Cluster(root)
    try:
        subprocess.run(
            _as_owner(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(cluster.data),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "--locale=C.UTF-8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        # A test cluster: durability off (fsync), small, and only reachable by its socket.
        options = (
            f"-k {root} -p {cluster.port} -c listen_addresses='' -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        subprocess.run(
            _as_owner(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(cluster.data),
                    "-o",
                    options,
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster
