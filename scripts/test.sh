#!/usr/bin/env bash
# The README's test command: set up, then run the whole suite (tests/ and the doctests in srpo_graph/).
#   bash scripts/test.sh [PYTEST ARGS]          the whole suite (CI runs this)
#   bash scripts/test.sh --fast [PYTEST ARGS]   the fast lane, for the edit-test loop: the unit tests and
#       doctests, without the tests that train a model end to end (marker slow), need a real SGLang
#       server (sglang) or start Python processes (proc); pyproject.toml registers the markers
# Both run on SRPO_GRAPH_TEST_WORKERS pytest-xdist workers (default 2; 0: one process), grouped so that
# a shared server or reference run is made once (tests/support/parallel.py; the measurement behind
# the default: docs/performance.md, "CI time").
set -euo pipefail
fast=()
if [ "${1:-}" = "--fast" ]; then
  shift
  fast=(-m "not slow and not sglang and not proc")
fi
cd "$(dirname "$0")/.."
# (.ci/run has run the set-up already and says so with SRPO_GRAPH_SETUP_DONE=1: one pip pass, not two)
[ -n "${SRPO_GRAPH_SETUP_DONE:-}" ] || bash scripts/setup.sh
n="${SRPO_GRAPH_TEST_WORKERS:-2}"
workers=(-n "$n" --dist loadgroup)
[ "$n" != 0 ] || workers=(-p no:xdist)
# the workers share the cores: each gets its share of torch's (OpenMP) threads, unless set already --
# two workers of two threads on two cores left one thread of each spinning while it waited for a core
# (the fast lane 138 -> 127 s, its CPU time 187 -> 161 s: docs/performance.md, "CI time")
if [ "$n" != 0 ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
  per=$(( $(nproc 2>/dev/null || echo 2) / n ))
  export OMP_NUM_THREADS=$(( per > 0 ? per : 1 ))
fi
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "${workers[@]}" ${fast[@]+"${fast[@]}"} "$@"  # (the +: bash 3 and set -u)
