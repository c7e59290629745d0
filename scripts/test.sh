#!/usr/bin/env bash
# Set up (first time only), build the sandbox images if needed (the default one, with Node.js
# 22.16, Java, PHP, Ruby, Go, build and media tools, takes about 7 minutes the first time on a
# busy 2-core machine; the minimal one, which some tests use, about 2), lint, type-check, run
# the tests: the whole suite on SQLite (the store contract suite runs on SQLite and on a
# throwaway PostgreSQL cluster there), then the PostgreSQL lane: the API tests of containers,
# files and keys against servers whose database is PostgreSQL, then the cluster lane
# (``-m cluster``, tests/cluster): PostgreSQL, two nodes, two API replicas and HAProxy on this
# machine, with the API tests of containers, calls, files and skills sent to HAProxy's port.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/shellbox image build --profile default --state-dir "$PWD/.state"
.venv/bin/shellbox image build --profile minimal --state-dir "$PWD/.state"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/pytest -m "not cluster" "$@"
SHELLBOX_TEST_DATABASE=postgresql .venv/bin/pytest "$@" \
  tests/api/test_containers.py tests/api/test_files.py tests/api/test_auth.py
SHELLBOX_TEST_CLUSTER=1 exec .venv/bin/pytest "$@" tests/cluster $CLUSTER_API_TESTS
