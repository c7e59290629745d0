"""Egress fixtures: the local "internet" and a shellbox server that trusts its CA and resolves
the test names to it (``--egress-upstream-ca``, ``--egress-hosts-file``). Nothing leaves this
machine."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from egress_helpers import (
    HERE,
    HOST_NAME,
    NAMES,
    NOCERT_NAME,
    UP_HOST_IF,
    UP_HOST_IP,
    UP_IP,
    UP_NS,
    EgressServer,
    Upstream,
    cleanup,
    make_certs,
    make_dir,
    remove_netns,
    sh,
    start_server,
)


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    d = make_dir("shellbox-egress-up-")
    make_certs(d)
    hosts = d / "hosts"
    hosts.write_text(
        f"# test names\n{UP_IP} {' '.join(NAMES)} {NOCERT_NAME}\n{UP_HOST_IP} {HOST_NAME}\n"
    )
    remove_netns(UP_NS, UP_HOST_IF)
    sh("ip", "-batch", "-", input=(
        f"netns add {UP_NS}\n"
        f"link add {UP_HOST_IF} type veth peer name eth0 netns {UP_NS}\n"
        f"addr add {UP_HOST_IP}/30 dev {UP_HOST_IF}\n"
        f"link set {UP_HOST_IF} up\n"
    ))  # fmt: skip
    sh("ip", "-n", UP_NS, "-batch", "-", input=(
        f"addr add {UP_IP}/30 dev eth0\nlink set lo up\nlink set eth0 up\n"
    ))  # fmt: skip
    log = d / "seen.jsonl"
    proc = subprocess.Popen(
        ["ip", "netns", "exec", UP_NS, sys.executable, str(HERE / "upstream.py"),
         "--cert", str(d / "srv.pem"), "--key", str(d / "srv.key"), "--log", str(log),
         "--extra-ports", "22,8080"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "upstream did not start"
        yield Upstream(UP_IP, log, d / "ca.pem", hosts)
    finally:
        proc.kill()
        proc.wait()
        remove_netns(UP_NS, UP_HOST_IF)
        sh("rm", "-rf", str(d))


@pytest.fixture(scope="session")
def egress(server_factory: Callable[..., Any], upstream: Upstream) -> Iterator[EgressServer]:
    es = start_server(
        server_factory,
        ["--egress-upstream-ca", str(upstream.ca), "--egress-hosts-file", str(upstream.hosts_file)],
    )
    yield es
    cleanup(es)
