#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite (tests/ and the doctests in srpo_graph/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
