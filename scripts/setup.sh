#!/usr/bin/env bash
# Installs everything shellbox needs on a Debian 12 host (run as root), idempotently:
# the Debian packages, the server's virtual environment (.venv) and the egress proxy's own
# (.venv-egress: mitmproxy 11 pins an h11 the openai SDK cannot share).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(crun runc postgresql haproxy btrfs-progs mmdebstrap nftables iproute2 util-linux procps golang-github-containers-common ca-certificates
  podman   # scripts/image.sh loads the deployment image into it; tests/deploy/ runs it
  chromium)  # the console tests drive it headless (tests/api/test_console.py)
missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
stamp() { sha256sum "$@" | sha256sum | cut -c1-16; }

want=$(stamp requirements.lock pyproject.toml)
if [ ! -x .venv/bin/shellbox ] || [ "$(cat .venv/.shellbox-stamp 2>/dev/null)" != "$want" ]; then
  echo "setup: creating .venv"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.lock
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" > .venv/.shellbox-stamp
fi

if [ -f requirements-egress.lock ]; then
  want=$(stamp requirements-egress.lock)
  if [ ! -x .venv-egress/bin/mitmdump ] || [ "$(cat .venv-egress/.shellbox-stamp 2>/dev/null)" != "$want" ]; then
    echo "setup: creating .venv-egress (mitmproxy)"
    [ -x .venv-egress/bin/python ] || "$PY" -m venv .venv-egress
    .venv-egress/bin/pip install -q --disable-pip-version-check -r requirements-egress.lock
    echo "$want" > .venv-egress/.shellbox-stamp
  fi
fi
