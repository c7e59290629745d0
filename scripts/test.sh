#!/usr/bin/env bash
# Set up (first time only), build the sandbox images if needed (the default one, with Node.js
# 22.16, Java, PHP, Ruby, Go, build and media tools, takes about 7 minutes the first time on a
# busy 2-core machine; the minimal one, which some tests use, about 2), lint, type-check, run
# the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/shellbox image build --profile default --state-dir "$PWD/.state"
.venv/bin/shellbox image build --profile minimal --state-dir "$PWD/.state"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
