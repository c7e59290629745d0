"""The egress feature: allowlist containers get their policy and secrets by value in their
spec, placeholders for the secrets in their environment, and the audit is read back.

Built by ``install`` (called by the composition root, ``services.py``, which attaches it to
container creation as a ``ContainerFeature``, with its warm pool for allowlist creations):

- check: validate ``network_policy`` (400 naming the bad entry; the operator's
  ``egress.allow`` bounds it).
- provision: make the secrets' placeholders and fill ``Provisioned`` (the public policy, the
  sealed secrets the database keeps, the placeholders, and the ``NetworkSpec``: allowlist and
  secrets by value, for the runtime).

Everything on the sandboxes' machine (the namespaces, the proxy and what it is told, the
CA bundles, the audit file) is the runtime's, through its ``SandboxNetwork`` collaborator
(``network.py``): this feature never touches a host path, so a runtime on another machine
serves allowlist containers the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets as random
import shutil
from collections.abc import Callable
from typing import Any

from shellbox.egress import policy as pol
from shellbox.egress.audit import event_object
from shellbox.egress.sealing import SecretSealer, load_key, seal_plaintext_rows
from shellbox.egress.supervisor import find_python
from shellbox.errors import InvalidRequest
from shellbox.features import ContainerFeature, CreateContainer, Provisioned
from shellbox.principal import Principal
from shellbox.sandbox import ContainerSpec, NetworkSpec, Runtime, SecretInjection
from shellbox.sandbox.warm_pool import WarmPool
from shellbox.settings import Settings
from shellbox.store import ContainerStore, EgressStore

log = logging.getLogger("shellbox.egress")

PLACEHOLDER_PREFIX = "shellbox-secret-"


class EgressService(ContainerFeature):
    def __init__(
        self,
        settings: Settings,
        store: EgressStore,
        container_rows: ContainerStore,
        runtime: Runtime,
        default_spec: Callable[[str], ContainerSpec],
        flush_audit: Callable[[], None] | None = None,
    ) -> None:
        self.default_spec = default_spec  # a container created with no options, by id
        self.settings = settings.egress
        self.store = store
        self.container_rows = container_rows
        self.runtime = runtime
        # Moves what the proxy audited a moment ago into the database (the runtime's network
        # on this machine), so that the audit endpoint answers with it; None: rows arrive on
        # the network's own schedule (a node's).
        self.flush_audit = flush_audit
        self.operator: list[str] | None = None
        if self.settings.allow is not None:
            try:
                self.operator = pol.validate_operator_allowlist(self.settings.allow)
            except ValueError as exc:
                raise InvalidRequest(str(exc), param="egress.allow") from None
        key_path = settings.secrets_key_file()
        self.sealer = SecretSealer(load_key(key_path), key_path)
        missing = [tool for tool in ("ip", "nft", "setpriv") if shutil.which(tool) is None]
        self.unavailable_reason: str | None = None
        if not self.settings.enabled:
            self.unavailable_reason = "egress.enabled is false"
        elif find_python(self.settings.python) is None:
            self.unavailable_reason = "the proxy's .venv-egress is missing (run ./scripts/setup.sh)"
        elif missing:
            self.unavailable_reason = f"missing host tools: {', '.join(missing)}"
        # Whether allowlist containers are wanted: the warm pool fills only from then on, so
        # a server that never serves one never starts the proxy for it.
        self._wanted = False
        self.warm = WarmPool(
            self.runtime,
            self._pooled_spec,
            self.settings.warm_containers,
            enabled=lambda: self._wanted,
        )

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    async def start(self) -> None:
        """At server start: the pool is wanted when asked for, or when allowlist containers
        live."""
        if not self.available:
            return
        live = any(r.network_policy.get("type") == "allowlist" for r in self.container_rows.live())
        if self.settings.prestart or live:
            self._wanted = True

    async def close(self) -> None:
        return

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
        if not self._wanted:
            self._wanted = True
            self.warm.refill()
        placeholders: dict[str, str] = {}
        secrets = []
        for s in policy.secrets:
            placeholder = placeholders.setdefault(s.name, PLACEHOLDER_PREFIX + random.token_hex(16))
            secrets.append(
                {"domain": s.domain, "name": s.name, "value": s.value, "placeholder": placeholder}
            )
        prov.network_policy = policy.public()
        prov.secrets = self.sealer.seal(secrets)  # what the database keeps
        prov.network = NetworkSpec(
            tuple(policy.allowed_domains),
            tuple(SecretInjection(s["domain"], s["placeholder"], s["value"]) for s in secrets),
        )
        prov.env.update(placeholders)

    async def _pooled_spec(self, cid: str) -> ContainerSpec:
        """A container for the warm pool: in a namespace of its own, with no allowlist yet
        (it reaches nothing until it is taken and given one)."""
        return dataclasses.replace(self.default_spec(cid), network=NetworkSpec())

    # -- the audit --------------------------------------------------------------------------

    def events(
        self, cid: str, *, after: str | None, limit: int, order: str
    ) -> tuple[list[dict[str, Any]], bool]:
        if self.flush_audit is not None:
            self.flush_audit()  # what the proxy wrote a moment ago is part of the answer
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
    flush_audit: Callable[[], None] | None = None,
) -> EgressService:
    """The egress feature (the caller attaches it to container creation)."""
    egress = EgressService(settings, store, container_rows, runtime, default_spec, flush_audit)
    seal_plaintext_rows(container_rows, egress.sealer)
    return egress
