#!/usr/bin/env bash
# A shellbox cluster on this one machine: PostgreSQL (Debian's, in a temporary data directory),
# two sandbox nodes (`shellbox node`, separate state directories, sharing the built images),
# two API replicas (`shellbox serve --role api`) and HAProxy round-robin in front of them.
#
#   ./scripts/cluster.sh                 # on http://127.0.0.1:8000/v1; Ctrl-C stops them all
#   ./scripts/cluster.sh --port 9000 --nodes 3 --replicas 2 --dir /var/tmp/c --keep
#
# No API keys exist at first, so every bearer token is accepted (loopback only); make one with
#   SHELLBOX_STORE__DATABASE_URL=<the printed URL> .venv/bin/shellbox keys create --project me
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
profile=${SHELLBOX_RUNTIME__IMAGE_PROFILE:-default}
.venv/bin/shellbox image build --profile "$profile" --state-dir "$PWD/.state" >/dev/null
exec .venv/bin/python -m shellbox.cluster.local --image-dir "$PWD/.state/images" "$@"
