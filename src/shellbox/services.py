"""Wiring: build every service from the settings, in dependency order, and tear them down.

Optional features (apply_patch, skills, egress, responses) attach themselves here to the core
services through their hooks, so the core never imports them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from shellbox.sandbox import OciRuntime, create_runtime
from shellbox.service.calls import CallService
from shellbox.service.containers import ContainerService
from shellbox.service.files import FileService
from shellbox.service.idempotency import IdempotencyService
from shellbox.service.keys import KeyService, is_loopback
from shellbox.service.shell import ShellLimits
from shellbox.settings import Settings
from shellbox.store import Database, create_database


@dataclass
class Services:
    settings: Settings
    db: Database
    runtime: OciRuntime
    keys: KeyService
    containers: ContainerService
    files: FileService
    calls: CallService
    limits: ShellLimits
    extras: dict[str, Any] = field(default_factory=dict)  # feature name -> its service
    closers: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)

    async def start(self) -> None:
        """Recover what a previous run left, then start background work."""
        for feature in self.extras.values():
            start = getattr(feature, "start", None)
            if start is not None:
                await start()
        await self.containers.recover()
        self.files.start()
        self.containers.start_reaper()

    async def close(self) -> None:
        await self.containers.stop_reaper()
        await self.files.close()
        for closer in reversed(self.closers):
            with contextlib.suppress(Exception):
                await closer()
        self.db.dispose()


def create_services(settings: Settings, runtime: OciRuntime | None = None) -> Services:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url())
    runtime = runtime or create_runtime(settings)
    limits = ShellLimits.from_settings(settings.limits)
    keys = KeyService(db, open_allowed=is_loopback(settings.server.host))
    containers = ContainerService(settings, db, runtime)
    files = FileService(settings, db, containers)
    calls = CallService(containers, files, limits)
    services = Services(settings, db, runtime, keys, containers, files, calls, limits)
    idempotency = IdempotencyService(db, settings.lifecycle.idempotency_ttl_s)
    containers.provision_hooks.append(idempotency.attach_container)
    containers.reap_hooks.append(idempotency.purge_expired)
    services.extras["idempotency"] = idempotency
    for install in FEATURES:
        install(services)
    return services


# Optional features: each ``install`` attaches its service to the core through the hooks
# (provision/release hooks, calls.handlers, extras). Imported when called, since every
# feature's package imports this module for ``Services``.


def _install_metering(services: Services) -> None:
    from shellbox.service.metering import MeteringService
    from shellbox.service.metrics import Metrics
    from shellbox.store.metering import SqlAdminKeyStore, SqlStatsStore, SqlUsageStore

    db = services.db
    metering = MeteringService(
        services.settings.metering,
        db,
        SqlUsageStore(db),
        SqlAdminKeyStore(db),
        Metrics(SqlStatsStore(db)),
    )
    services.extras["metering"] = metering
    services.containers.provision_hooks.append(metering.on_create)
    services.containers.wake_hooks.append(metering.on_wake)
    services.containers.release_hooks.append(metering.on_release)


def _install_apply_patch(services: Services) -> None:
    from shellbox.service.patching import PatchService

    patcher = PatchService(services.containers, services.files)
    services.extras["apply_patch"] = patcher
    services.calls.handlers["apply_patch_call"] = patcher.apply_patch_call


def _install_skills(services: Services) -> None:
    from shellbox.skills import install

    install(services)


def _install_egress(services: Services) -> None:
    from shellbox.egress.service import install

    install(services)


def _install_responses(services: Services) -> None:
    from shellbox.responses import install

    install(services)


FEATURES: list[Callable[[Services], None]] = [
    _install_metering,
    _install_apply_patch,
    _install_skills,
    _install_egress,
    _install_responses,
]
