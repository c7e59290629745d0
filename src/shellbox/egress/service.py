"""The egress feature: allowlist containers get a namespace, the proxy's CA and variables,
and placeholders for their secrets; the proxy gets their policy; the audit gets ingested.

Built by ``install`` (called by the composition root, ``services.py``, which attaches it to
container creation as a ``ContainerFeature``, with its warm pool for allowlist creations):

- provision: validate ``network_policy`` (400 naming the bad entry; the operator's
  ``egress.allow`` bounds it), take a namespace from the warm pool, tell the proxy the
  container's policy, and fill ``Provisioned`` (public policy, secrets, env, CA mounts, netns).
- before start: make sure the proxy runs and the namespace exists (after a restart or reboot).
- release: forget the policy and tear the namespace down.

The proxy starts with the first allowlist container (or at boot with ``egress.prestart``, or
when live allowlist containers are recovered), so servers that never use egress never pay
for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets as random
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shellbox.egress import policy as pol
from shellbox.egress.audit import AuditTail, event_object
from shellbox.egress.netns import NetnsPool, Slot
from shellbox.egress.paths import (
    CA_IN_CONTAINER,
    NODE_PRELOAD_IN_CONTAINER,
    SYSTEM_BUNDLE,
    EgressPaths,
    write_atomic,
)
from shellbox.egress.sealing import SecretSealer, load_key, seal_plaintext_rows
from shellbox.egress.supervisor import ProxySupervisor, find_python
from shellbox.errors import InvalidRequest, SandboxError
from shellbox.features import ContainerFeature, CreateContainer, Provisioned
from shellbox.principal import Principal
from shellbox.sandbox import ContainerSpec, Mount, Runtime
from shellbox.sandbox.run_dirs import run_base_for
from shellbox.sandbox.warm_pool import WarmPool
from shellbox.settings import Settings
from shellbox.store import ContainerStore, EgressStore
from shellbox.store.records import ContainerRecord

log = logging.getLogger("shellbox.egress")

HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NO_PROXY = "localhost,127.0.0.1,::1"
NODE_PRELOAD = Path(__file__).with_name("node_proxy.cjs")
PLACEHOLDER_PREFIX = "shellbox-secret-"
AUDIT_INTERVAL_S = 0.5


class EgressService(ContainerFeature):
    def __init__(
        self,
        settings: Settings,
        store: EgressStore,
        container_rows: ContainerStore,
        runtime: Runtime,
        default_spec: Callable[[str], ContainerSpec],
    ) -> None:
        self.state_dir = settings.state_dir
        self.default_spec = default_spec  # a container created with no options, by id
        self.settings = settings.egress
        self.store = store
        self.container_rows = container_rows
        self.runtime = runtime
        self.operator: list[str] | None = None
        if self.settings.allow is not None:
            try:
                self.operator = pol.validate_operator_allowlist(self.settings.allow)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="egress.allow") from None
        key_path = settings.secrets_key_file()
        self.sealer = SecretSealer(load_key(key_path), key_path)
        # This server's volatile directory on this host (the proxy and the namespaces are
        # host-local, like the sandboxes they serve); its name keys the host-wide slot claims.
        self.run_dir = run_base_for(settings.state_dir)
        self.paths = EgressPaths(settings.state_dir / "egress", self.run_dir / "egress")
        self.python = find_python(self.settings.python)
        missing = [tool for tool in ("ip", "nft", "setpriv") if shutil.which(tool) is None]
        self.unavailable_reason: str | None = None
        if not self.settings.enabled:
            self.unavailable_reason = "egress.enabled is false"
        elif self.python is None:
            self.unavailable_reason = "the proxy's .venv-egress is missing (run ./scripts/setup.sh)"
        elif missing:
            self.unavailable_reason = f"missing host tools: {', '.join(missing)}"
        self.port = 0
        self.pool: NetnsPool | None = None
        self.proxy: ProxySupervisor | None = None
        self.tail = AuditTail(self.store, self.paths.audit, self.paths.audit_offset)
        self.clients: dict[str, dict[str, Any]] = {}  # sandbox address -> addon entry
        self._started = False
        self._start_lock = asyncio.Lock()
        self._tail_task: asyncio.Task[None] | None = None
        # Containers started ahead of time in a namespace of their own, for allowlist
        # creations (the policy is given to the proxy when one is taken): container -> slot.
        self._pooled_slots: dict[str, Slot] = {}
        self.warm = WarmPool(
            self.runtime,
            self._pooled_spec,
            self.settings.warm_containers,
            release=self._release_pooled,
            enabled=lambda: self._started,
        )

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    # -- start / stop -----------------------------------------------------------------------

    async def start(self) -> None:
        """At server start: only when asked to, or when live allowlist containers need it."""
        if not self.available:
            return
        if self.settings.prestart or self._live_slots():
            await self.ensure_started()

    async def ensure_started(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if not self.available:
                msg = f"egress is not available on this server: {self.unavailable_reason}"
                raise SandboxError(msg)
            assert self.python is not None
            self.paths.make()
            self.port = self._choose_port()
            self._write_upstream_bundle()
            self.proxy = ProxySupervisor(
                python=self.python,
                paths=self.paths,
                port=self.port,
                hosts_file=self.settings.hosts_file,
                intercept=self.settings.intercept,
            )
            self._rebuild_clients()
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
                # the CA exists once mitmproxy has started
                self._write_container_bundle(await self.runtime.image_file(SYSTEM_BUNDLE))
                await pool.start(keep=self._live_slots().values())
            except BaseException:
                await self.proxy.stop()
                raise
            self.pool = pool
            self._tail_task = asyncio.create_task(self._tail_forever(), name="egress-audit")
            self._started = True
            self.warm.refill()
            log.info("egress proxy listening on port %d", self.port)

    async def close(self) -> None:
        if self._tail_task is not None:
            self._tail_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail_task
        if self.proxy is not None:
            await self.proxy.stop()
        try:
            self.tail.ingest()  # the last lines the proxy wrote
        except Exception:
            log.exception("ingesting the egress audit at shutdown failed")
        if self.pool is not None:
            await self.pool.close()
        self._started = False

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

    def _write_container_bundle(self, system: bytes | None) -> None:
        """The image's own CA bundle (``system``) plus the proxy's CA, for the containers."""
        ca = self.paths.mitm_ca.read_bytes()
        parts = [system or b"", ca]
        if self.settings.intercept == "secrets":
            # tunnelled connections reach the sandbox with the upstream's own certificate
            parts += [Path(c).read_bytes() for c in self.settings.upstream_ca]
        write_atomic(self.paths.ca_cert, ca, 0o644)
        write_atomic(self.paths.ca_bundle, b"\n".join(p.strip() for p in parts) + b"\n", 0o644)
        write_atomic(self.paths.node_preload, NODE_PRELOAD.read_bytes(), 0o644)

    async def _tail_forever(self) -> None:
        while True:
            await asyncio.sleep(AUDIT_INTERVAL_S)
            try:
                self.tail.ingest()
            except Exception:
                log.exception("ingesting the egress audit failed")

    # -- the proxy's view -------------------------------------------------------------------

    def _entry(self, cid: str, allowed: list[str], secrets: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "container": cid,
            "allowed_domains": allowed,
            "allow": [pol.glob_regex(p) for p in allowed],
            "secrets": [
                {
                    "domain": pol.glob_regex(s["domain"]),
                    "placeholder": s["placeholder"],
                    "value": s["value"],
                }
                for s in secrets
            ],
        }

    def _write_policy(self) -> None:
        doc = {"blocked_networks": [self.settings.subnet], "clients": self.clients}
        write_atomic(self.paths.policy, json.dumps(doc).encode(), 0o600)

    def _live_slots(self) -> dict[str, int]:
        """container id -> slot, for containers that still run or sleep."""
        return self.store.live_slots()

    def _rebuild_clients(self) -> None:
        live = self._live_slots()
        if not live:
            self.clients = {}
            return
        self.clients = {}
        for record in self.container_rows.by_ids(list(live)):
            slot = NetnsPool.slot_for(self.settings.subnet, live[record.id])
            allowed = list(record.network_policy.get("allowed_domains", []))
            try:
                secrets = self.sealer.open(record.id, record.secrets)
            except SandboxError:
                # its traffic is refused (the proxy does not know it) rather than sent without
                # its credentials; the others still start
                log.exception("container %s keeps no egress", record.id)
                continue
            self.clients[slot.sandbox_ip] = self._entry(record.id, allowed, secrets)

    # -- hooks ------------------------------------------------------------------------------

    def check(self, principal: Principal, req: CreateContainer, prov: Provisioned) -> None:
        """Validate the request's allowlist (a 400 naming the bad entry) into
        ``prov.allowlist``, once per creation. Run before a pooled container is taken, so a
        refused request costs no container."""
        raw = req.network_policy or {}
        if raw.get("type") != "allowlist":
            return  # disabled: the runtime's private namespace has loopback only
        policy = pol.validate_policy(raw, operator=self.operator)
        if not self.available:
            msg = (
                f"network_policy 'allowlist' is not available on this server "
                f"({self.unavailable_reason}); use {{'type': 'disabled'}}"
            )
            raise InvalidRequest(msg, param="network_policy")
        prov.allowlist = policy

    async def provision(
        self, principal: Principal, req: CreateContainer, cid: str, prov: Provisioned
    ) -> None:
        policy = prov.allowlist  # validated by ``check``
        if not isinstance(policy, pol.AllowlistPolicy):
            return
        await self.ensure_started()
        assert self.pool is not None
        slot = self._pooled_slots.pop(cid, None) or await self.pool.acquire()
        try:
            self.store.claim_slot(cid, slot.index, int(time.time()))
        except BaseException:
            self.pool.release_soon(slot)
            raise
        placeholders: dict[str, str] = {}
        secrets = []
        for s in policy.secrets:
            placeholder = placeholders.setdefault(s.name, PLACEHOLDER_PREFIX + random.token_hex(16))
            secrets.append(
                {"domain": s.domain, "name": s.name, "value": s.value, "placeholder": placeholder}
            )
        self.clients[slot.sandbox_ip] = self._entry(cid, list(policy.allowed_domains), secrets)
        self._write_policy()
        prov.network_policy = policy.public()
        prov.secrets = self.sealer.seal(secrets)  # what the database keeps
        prov.netns_path = slot.netns_path
        prov.env.update(self._env(slot))
        prov.env.update(placeholders)
        prov.mounts.extend(self._mounts())

    def _mounts(self) -> list[Mount]:
        return [
            Mount(self.paths.ca_bundle, SYSTEM_BUNDLE),
            Mount(self.paths.ca_cert, CA_IN_CONTAINER),
            Mount(self.paths.node_preload, NODE_PRELOAD_IN_CONTAINER),
        ]

    async def _pooled_spec(self, cid: str) -> ContainerSpec:
        """A container for the warm pool: in a namespace of its own, which the proxy knows
        nothing about until the container is taken (so it reaches nothing before)."""
        assert self.pool is not None
        slot = await self.pool.acquire()
        self._pooled_slots[cid] = slot
        return dataclasses.replace(
            self.default_spec(cid),
            env=self._env(slot),
            mounts=tuple(self._mounts()),
            netns_path=slot.netns_path,
        )

    async def _release_pooled(self, cid: str) -> None:
        slot = self._pooled_slots.pop(cid, None)
        if slot is not None and self.pool is not None:
            self.pool.release_soon(slot)

    def _env(self, slot: Slot) -> dict[str, str]:
        proxy = f"http://{slot.host_ip}:{self.port}"
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

    async def before_start(self, record: ContainerRecord) -> None:
        if record.network_policy.get("type") != "allowlist":
            return
        index = self._slot_of(record.id)
        if index is None:
            return
        await self.ensure_started()
        assert self.pool is not None
        slot = self.pool.slot(index)
        if not self.pool.exists(slot):
            await self.pool.ensure(index)
        if slot.sandbox_ip not in self.clients:
            allowed = list(record.network_policy.get("allowed_domains", []))
            secrets = self.sealer.open(record.id, record.secrets)
            self.clients[slot.sandbox_ip] = self._entry(record.id, allowed, secrets)
            self._write_policy()

    async def release(self, record: ContainerRecord) -> None:
        await self._release_pooled(record.id)  # a pooled container whose creation failed
        index = self._slot_of(record.id)
        if index is None:
            return
        self.store.release_slot(record.id)
        slot = NetnsPool.slot_for(self.settings.subnet, index)
        entry = self.clients.get(slot.sandbox_ip)
        if entry is not None and entry["container"] == record.id:
            del self.clients[slot.sandbox_ip]
            self._write_policy()
        if self.pool is not None:
            self.pool.release_soon(slot)
        else:  # the proxy never started in this run: remove the namespace now
            port = self.port or self._choose_port()
            owner = self.run_dir.name
            cleanup = NetnsPool(subnet=self.settings.subnet, owner=owner, port=port, size=0)
            await cleanup.destroy(slot)

    def _slot_of(self, cid: str) -> int | None:
        return self.store.slot_of(cid)

    # -- the audit --------------------------------------------------------------------------

    def events(
        self, cid: str, *, after: str | None, limit: int, order: str
    ) -> tuple[list[dict[str, Any]], bool]:
        self.tail.ingest()  # what the proxy wrote a moment ago is part of the answer
        rows, has_more = self.store.events(
            cid, after=after, limit=limit, order="asc" if order == "asc" else "desc"
        )
        return [event_object(r) for r in rows], has_more


def install(
    settings: Settings,
    store: EgressStore,
    container_rows: ContainerStore,
    runtime: Runtime,
    default_spec: Callable[[str], ContainerSpec],
) -> EgressService:
    """The egress feature (the caller attaches it to container creation, and closes it)."""
    egress = EgressService(settings, store, container_rows, runtime, default_spec)
    seal_plaintext_rows(container_rows, egress.sealer)
    return egress
