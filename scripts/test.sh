#!/usr/bin/env bash
# Set up (first time only), build the sandbox image if needed, lint, type-check, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/shellbox image build --state-dir "$PWD/.state"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
