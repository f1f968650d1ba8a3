#!/usr/bin/env bash
# Set-up on a fresh machine: the CPU build of torch (only where no torch is installed, so a
# GPU user's CUDA build is kept), then srpo-graph itself with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0 (CPU build)"
  "$PY" -m pip install --quiet --root-user-action=ignore "torch==2.13.0"
fi
"$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e ".[dev,wandb,datasets,tokenizers]"  # the extras: their tests run in CI
# The source tree's bytecode, once: pip compiles what it installs, but an editable install is this
# folder, and where PYTHONDONTWRITEBYTECODE is set (this project's machines and CI) no process
# writes a __pycache__, so each process (a test run starts ~280, about half of them importing
# srpo-graph) compiled every module it imported again: 0.25-0.4 CPU-s for the whole package
# (benchmarks/bench_bytecode.py, docs/performance.md). A stale .pyc is never used: Python checks it
# against its source's size and time.
"$PY" -m compileall -q srpo_graph tests benchmarks >/dev/null
# The tiny default model is built in code (no hub): make it once so later commands start fast.
# The released tokenizers are derived from their BPE ranks once (~20 s each), then cached.
# (one python for both: its imports are most of the set-up's time once they are made)
"$PY" -c "from srpo_graph.models.tiny import ensure_tiny_model; print('setup: tiny model at', ensure_tiny_model())
from srpo_graph.models.vocab import VOCABS, ensure_vocab_tokenizer
for n in VOCABS: print('setup: tokenizer', n, 'at', ensure_vocab_tokenizer(n))"
