#!/usr/bin/env bash
# Set up (first time only), build the sandbox images if needed (the full profile, with Java,
# PHP, Ruby, Go and build tools, takes about two minutes the first time), lint, type-check, run
# the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/shellbox image build --state-dir "$PWD/.state"
.venv/bin/shellbox image build --profile full --state-dir "$PWD/.state"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
