"""``EgressNetwork``: the driver's side of egress, on the machine that runs the sandboxes.

A container whose ``ContainerSpec`` carries a ``NetworkSpec`` (an allowlist and its secrets,
by value) gets from here, through ``SandboxNetwork.attach``: a network namespace of its own
(a slot of ``netns.NetnsPool``), the proxy's variables, and the CA bundle and preload it
mounts. The proxy (``supervisor.py``) runs beside the runtime and learns each container's
policy keyed by its sandbox address; its audit lines are moved into the database
(``EgressStore``: in one-machine serve the server's, on a node the cluster's).

The composition root builds one and injects it into ``OciRuntime``; the driver calls
``attach`` at creation, at every start (a restart, a reboot) and at a resume, and ``detach``
when the container is destroyed. Which slot a container holds, and its policy, are kept on
this machine's disk (``<state>/egress/slots/<container>``, 0600 in a 0700 directory), the
secrets sealed with this machine's key (``sealing.py``; the driver's own copy of the spec
holds no secret value): after a restart ``attach`` is called without a policy and finds it
there.

The proxy starts with the first container attached (or at ``start`` with ``egress.prestart``,
or when containers holding a slot are found at ``start``), so a machine that never runs an
allowlist container never pays for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shellbox.egress import policy as pol
from shellbox.egress.audit import AuditTail
from shellbox.egress.netns import NetnsPool, Slot
from shellbox.egress.paths import (
    CA_IN_CONTAINER,
    NODE_PRELOAD_IN_CONTAINER,
    SYSTEM_BUNDLE,
    EgressPaths,
    write_atomic,
)
from shellbox.egress.sealing import SecretSealer, load_key
from shellbox.egress.supervisor import ProxySupervisor, find_python
from shellbox.errors import SandboxError
from shellbox.sandbox.base import Mount, NetworkAttachment, NetworkSpec, SecretInjection
from shellbox.sandbox.run_dirs import run_base_for
from shellbox.settings import Settings
from shellbox.store import EgressStore

log = logging.getLogger("shellbox.egress")

HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NO_PROXY = "localhost,127.0.0.1,::1"
NODE_PRELOAD = Path(__file__).with_name("node_proxy.cjs")
AUDIT_INTERVAL_S = 0.5


class EgressNetwork:
    """A ``SandboxNetwork``: namespaces, the proxy and its policy, the audit's ingestion."""

    def __init__(self, settings: Settings, store: EgressStore) -> None:
        self.settings = settings.egress
        self.state_dir = settings.state_dir
        self.store = store
        key_path = settings.secrets_key_file()
        self.sealer = SecretSealer(load_key(key_path), key_path)
        # The runtime's volatile directory on this host (the proxy and the namespaces are
        # host-local, like the sandboxes they serve); its name keys the host-wide slot claims.
        self.run_dir = run_base_for(settings.state_dir)
        self.paths = EgressPaths(settings.state_dir / "egress", self.run_dir / "egress")
        self.slots_dir = self.paths.state / "slots"
        self.python = find_python(self.settings.python)
        self.port = 0
        self.pool: NetnsPool | None = None
        self.proxy: ProxySupervisor | None = None
        self.tail = AuditTail(self.store, self.paths.audit, self.paths.audit_offset)
        self.clients: dict[str, dict[str, Any]] = {}  # sandbox address -> addon entry
        self._started = False
        self._bundle_written = False
        self._start_lock = asyncio.Lock()
        self._tail_task: asyncio.Task[None] | None = None

    # -- start / stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """At start-up: only when asked to, or when containers of this machine hold slots."""
        if self.settings.enabled and (self.settings.prestart or self._slots()):
            await self.ensure_started()

    async def ensure_started(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if self.python is None:
                msg = "egress is not available: the proxy's .venv-egress is missing"
                raise SandboxError(msg)
            self.paths.make()
            self.slots_dir.mkdir(exist_ok=True)
            self.slots_dir.chmod(0o700)
            self.port = self._choose_port()
            self._write_upstream_bundle()
            self.proxy = ProxySupervisor(
                python=self.python,
                paths=self.paths,
                port=self.port,
                hosts_file=self.settings.hosts_file,
                intercept=self.settings.intercept,
            )
            # No container is known to the proxy until it is attached in this run.
            self.clients = {}
            self._write_policy()
            pool = NetnsPool(
                subnet=self.settings.subnet,
                owner=self.run_dir.name,
                port=self.port,
                size=self.settings.pool_size,
                state_dir=str(self.state_dir.resolve()),
            )
            try:
                await self.proxy.start()
                await pool.start(keep=self._slots().values())
            except BaseException:
                await self.proxy.stop()
                raise
            self.pool = pool
            self._tail_task = asyncio.create_task(self._tail_forever(), name="egress-audit")
            self._started = True
            log.info("egress proxy listening on port %d", self.port)

    async def close(self) -> None:
        if self._tail_task is not None:
            self._tail_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail_task
        if self.proxy is not None:
            await self.proxy.stop()
        try:
            self.ingest()  # the last lines the proxy wrote
        except Exception:
            log.exception("ingesting the egress audit at shutdown failed")
        if self.pool is not None:
            await self.pool.close()
        self._started = False

    def ingest(self) -> None:
        """Move what the proxy has audited into the database now."""
        self.tail.ingest()

    def _choose_port(self) -> int:
        """The configured port, else the one chosen at the first start (containers keep it
        in their variables across restarts), else a free one."""
        if self.settings.proxy_port:
            return self.settings.proxy_port
        with contextlib.suppress(OSError, ValueError):
            return int(self.paths.port_file.read_text())
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = int(s.getsockname()[1])
        write_atomic(self.paths.port_file, str(port).encode(), 0o644)
        return port

    def _write_upstream_bundle(self) -> None:
        parts = [HOST_BUNDLE.read_bytes()] if HOST_BUNDLE.exists() else []
        for ca in self.settings.upstream_ca:
            try:
                parts.append(Path(ca).read_bytes())
            except OSError as exc:
                msg = f"egress.upstream_ca {ca}: {exc.strerror}"
                raise SandboxError(msg) from None
        write_atomic(self.paths.upstream_bundle, b"\n".join(parts), 0o600)

    def _write_container_bundle(self, image_rootfs: Path) -> None:
        """The image's own CA bundle plus the proxy's CA, for the containers (once per run:
        the CA exists once mitmproxy has started)."""
        if self._bundle_written:
            return
        try:
            system = (image_rootfs / SYSTEM_BUNDLE.lstrip("/")).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            system = b""
        ca = self.paths.mitm_ca.read_bytes()
        parts = [system, ca]
        if self.settings.intercept == "secrets":
            # tunnelled connections reach the sandbox with the upstream's own certificate
            parts += [Path(c).read_bytes() for c in self.settings.upstream_ca]
        write_atomic(self.paths.ca_cert, ca, 0o644)
        write_atomic(self.paths.ca_bundle, b"\n".join(p.strip() for p in parts) + b"\n", 0o644)
        write_atomic(self.paths.node_preload, NODE_PRELOAD.read_bytes(), 0o644)
        self._bundle_written = True

    async def _tail_forever(self) -> None:
        while True:
            await asyncio.sleep(AUDIT_INTERVAL_S)
            try:
                self.ingest()
            except Exception:
                log.exception("ingesting the egress audit failed")

    # -- slots held, on this machine's disk -----------------------------------------------

    def _slot_file(self, cid: str) -> Path:
        if not cid or "/" in cid or cid.startswith("."):
            msg = f"not a container id: {cid!r}"
            raise SandboxError(msg)
        return self.slots_dir / cid

    def _held(self, cid: str) -> tuple[int, NetworkSpec] | None:
        """The slot the container holds and its policy (secrets opened), if it holds one."""
        try:
            raw = json.loads(self._slot_file(cid).read_text())
            index = int(raw["slot"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        [opened] = self.sealer.open(cid, [raw["policy"]])
        policy = json.loads(opened["policy"])
        network = NetworkSpec(
            tuple(policy["allowed_domains"]),
            tuple(SecretInjection(*s) for s in policy["secrets"]),
        )
        return index, network

    def _hold(self, cid: str, index: int, network: NetworkSpec) -> None:
        policy = {
            "allowed_domains": list(network.allowed_domains),
            "secrets": [[s.domain, s.placeholder, s.value] for s in network.secrets],
        }
        [sealed] = self.sealer.seal([{"policy": json.dumps(policy)}])
        doc = {"slot": index, "policy": sealed}
        write_atomic(self._slot_file(cid), json.dumps(doc).encode(), 0o600)

    def _slot_of(self, cid: str) -> int | None:
        try:
            return int(json.loads(self._slot_file(cid).read_text())["slot"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _slots(self) -> dict[str, int]:
        """container id -> slot, for every container of this machine that holds one."""
        found: dict[str, int] = {}
        if self.slots_dir.is_dir():
            for entry in self.slots_dir.iterdir():
                index = self._slot_of(entry.name)
                if index is not None:
                    found[entry.name] = index
        return found

    # -- the proxy's view -------------------------------------------------------------------

    @staticmethod
    def _entry(cid: str, network: NetworkSpec) -> dict[str, Any]:
        return {
            "container": cid,
            "allowed_domains": list(network.allowed_domains),
            "allow": [pol.glob_regex(p) for p in network.allowed_domains],
            "secrets": [
                {
                    "domain": pol.glob_regex(s.domain),
                    "placeholder": s.placeholder,
                    "value": s.value,
                }
                for s in network.secrets
            ],
        }

    def _write_policy(self) -> None:
        doc = {"blocked_networks": [self.settings.subnet], "clients": self.clients}
        write_atomic(self.paths.policy, json.dumps(doc).encode(), 0o600)

    # -- SandboxNetwork ---------------------------------------------------------------------

    async def attach(
        self, container_id: str, network: NetworkSpec | None, image_rootfs: Path
    ) -> NetworkAttachment:
        if not self.settings.enabled:
            msg = "egress is not available on this machine: egress.enabled is false"
            raise SandboxError(msg)
        await self.ensure_started()
        self._write_container_bundle(image_rootfs)
        assert self.pool is not None
        held = self._held(container_id)
        if held is None:
            if network is None:
                msg = f"container {container_id} holds no egress network on this machine"
                raise SandboxError(msg)
            slot = await self.pool.acquire()
            try:
                self._hold(container_id, slot.index, network)
            except BaseException:
                self.pool.release_soon(slot)
                raise
        else:
            index, kept = held
            if network is None:
                network = kept
            elif network != kept:
                self._hold(container_id, index, network)
            slot = self.pool.slot(index)
            if not self.pool.exists(slot):  # after a reboot, or a stop of this machine's
                await self.pool.ensure(index)
        # A namespace with no allowlist (a pooled container's) reaches nothing: the proxy
        # knows no client at its address until a policy is given.
        entry = self._entry(container_id, network) if network.allowed_domains else None
        if self.clients.get(slot.sandbox_ip) != entry:
            if entry is None:
                self.clients.pop(slot.sandbox_ip, None)
            else:
                self.clients[slot.sandbox_ip] = entry
            self._write_policy()
        return NetworkAttachment(slot.netns_path, self._env(slot), self._mounts())

    def env(self, container_id: str) -> Mapping[str, str]:
        index = self._slot_of(container_id)
        if index is None:
            return {}
        return self._env(NetnsPool.slot_for(self.settings.subnet, index))

    async def detach(self, container_id: str) -> None:
        index = self._slot_of(container_id)
        if index is None:
            return
        slot = NetnsPool.slot_for(self.settings.subnet, index)
        entry = self.clients.get(slot.sandbox_ip)
        if entry is not None and entry["container"] == container_id:
            del self.clients[slot.sandbox_ip]
            self._write_policy()
        self._slot_file(container_id).unlink(missing_ok=True)
        if self.pool is not None:
            self.pool.release_soon(slot)
        else:  # the proxy never started in this run: remove the namespace now
            port = self.port or self._choose_port()
            owner = self.run_dir.name
            cleanup = NetnsPool(subnet=self.settings.subnet, owner=owner, port=port, size=0)
            await cleanup.destroy(slot)

    def _mounts(self) -> tuple[Mount, ...]:
        return (
            Mount(self.paths.ca_bundle, SYSTEM_BUNDLE),
            Mount(self.paths.ca_cert, CA_IN_CONTAINER),
            Mount(self.paths.node_preload, NODE_PRELOAD_IN_CONTAINER),
        )

    def _env(self, slot: Slot) -> dict[str, str]:
        proxy = f"http://{slot.host_ip}:{self.port or self._choose_port()}"
        env = {}
        for name in ("HTTP_PROXY", "HTTPS_PROXY"):
            env[name] = env[name.lower()] = proxy
        env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"):
            env[name] = SYSTEM_BUNDLE
        env["NODE_EXTRA_CA_CERTS"] = CA_IN_CONTAINER
        # node (18 and 22.16) has no proxy support of its own: a preload routes http, https
        # and fetch
        env["NODE_OPTIONS"] = f"--require {NODE_PRELOAD_IN_CONTAINER}"
        return env
