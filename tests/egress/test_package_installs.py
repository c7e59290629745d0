"""``npm install`` and ``pip install`` in an allowlist container (the default image's Node.js
22.16 and pip) fetch a package from a local index through the egress proxy, as a model's
commands do from the real registries: npm by its own proxy support (it honours HTTPS_PROXY),
pip by the proxy variables, both trusting the proxy's CA."""

from __future__ import annotations

from collections.abc import Iterator

import packages
import pytest
from egress_helpers import EgressServer, Upstream, create, run

POLICY = {"type": "allowlist", "allowed_domains": ["files.example.test"]}


@pytest.fixture(scope="module")
def box(egress: EgressServer) -> Iterator[str]:
    with egress.http as http:
        cid = create(http, POLICY, name="egress-packages")
        yield cid
        http.delete(f"/v1/containers/{cid}")


def test_npm_install_from_a_local_registry(
    egress: EgressServer, box: str, upstream: Upstream
) -> None:
    upstream.clear()
    with egress.http as http:
        version, install, use = run(
            http,
            box,
            "node --version",
            "mkdir -p js && cd js && npm install --no-fund --no-audit"
            f" --registry=https://files.example.test/npm/ {packages.NAME}",
            f"cd js && node -e 'console.log(require(\"{packages.NAME}\"))'",
            timeout_ms=120_000,
        )
    assert version["stdout"].startswith("v22.16."), version
    assert install["outcome"]["exit_code"] == 0, install
    assert (use["stdout"], use["outcome"]["exit_code"]) == (packages.GREETING + "\n", 0), use
    seen = {(s["host"], s["path"], s["tls"]) for s in upstream.seen()}
    tarball = f"/npm/{packages.NAME}/-/{packages.TGZ}"
    assert ("files.example.test", tarball, True) in seen, seen


def test_pip_install_from_a_local_index(egress: EgressServer, box: str, upstream: Upstream) -> None:
    upstream.clear()
    with egress.http as http:
        install, use = run(
            http,
            box,
            f"pip install --index-url https://files.example.test/simple/ {packages.NAME}",
            "python -c 'import shellbox_hello; print(shellbox_hello.GREETING)'",
            timeout_ms=120_000,
        )
    assert install["outcome"]["exit_code"] == 0, install
    assert (use["stdout"], use["outcome"]["exit_code"]) == (packages.GREETING + "\n", 0), use
    seen = {(s["host"], s["path"], s["tls"]) for s in upstream.seen()}
    assert ("files.example.test", f"/files/{packages.WHEEL}", True) in seen, seen
