"""The egress proxy's entry point: mitmproxy with only the addons an egress proxy needs.

Run by ``supervisor.py`` with the Python of ``.venv-egress``:
``python proxy_main.py --set NAME=VALUE ...`` (mitmproxy option syntax).

Why not ``mitmdump -s addon.py``: mitmdump loads ~40 addons (replay, rewriting, the mitm.it
onboarding app, script hot-reloading, ``config.yaml`` from the confdir...) and calls each of
them on every event of every request; about a third of the proxy's time per request went
there. This master loads the core, the proxy server, layer selection, TLS, the h2c guard and
the error check, plus ours.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType

# mitmproxy lives only in .venv-egress; the server's environment (and mypy's) lacks it.
from mitmproxy import options  # type: ignore[import-not-found]
from mitmproxy.addons import (  # type: ignore[import-not-found]
    core,
    disable_h2c,
    errorcheck,
    next_layer,
    proxyserver,
    tlsconfig,
)
from mitmproxy.master import Master  # type: ignore[import-not-found]


def load_addon() -> ModuleType:
    """``addon.py`` from this directory (shellbox itself is not installed in .venv-egress)."""
    path = Path(__file__).resolve().with_name("addon.py")
    spec = importlib.util.spec_from_file_location("shellbox_egress_addon", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse(argv: list[str]) -> list[str]:
    specs = []
    it = iter(argv)
    for arg in it:
        if arg != "--set":
            msg = f"unexpected argument {arg!r}: use --set NAME=VALUE"
            raise SystemExit(msg)
        specs.append(next(it))
    return specs


async def main(argv: list[str]) -> None:
    addon = load_addon()
    opts = options.Options()
    master = Master(opts, with_termlog=True)
    master.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        disable_h2c.DisableH2C(),
        addon.EgressAddon(),
        errorcheck.ErrorCheck(),
    )
    opts.set(*parse(argv))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
