#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite (tests/ and the doctests in srpo_graph/).
set -euo pipefail
cd "$(dirname "$0")/.."
# (.ci/run has run the set-up already and says so with SRPO_GRAPH_SETUP_DONE=1: one pip pass, not two)
[ -n "${SRPO_GRAPH_SETUP_DONE:-}" ] || bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
