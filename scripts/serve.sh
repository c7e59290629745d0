#!/usr/bin/env bash
# Set up (first time only) and run the server. Extra arguments go to `shellbox serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/shellbox serve --state-dir "${SHELLBOX_STATE_DIR:-$PWD/.state}" "$@"
