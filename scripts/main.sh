#!/usr/bin/env bash
# The README's main job: set up, then train a coordination workflow (two agents of one tiny
# policy, written in parallel, consumed as one active set of size 2) on the embedded
# transformers backend, on CPU. A few minutes; leaves a run folder under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec srpo-graph train workflows/coord_par2.wf "$@"
