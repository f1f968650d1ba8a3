# shellcheck shell=bash
# The SGLang part of CI, sourced by .ci/run (and by tests/test_ci_sglang.sh's tests, one function at a time).
#
# CI installs a real SGLang server (CPU build) from ../shared/sglang-cpu when it can, and runs the
# real-server tests (pytest marker `sglang`) against it with SRPO_GRAPH_REQUIRE_SGLANG=1, so that
# "cannot start a server" fails instead of skipping. Machines differ: the CPU kernel library has an
# x86-64-v4 + AMX build and an x86-64-v3 (AVX2) build, and a CPU with neither, a failed install or
# a kernel that dies at import (SIGILL, rc 132: a build for another CPU) means no SGLang can run
# here. Then CI says so in one line, leaves SRPO_GRAPH_REQUIRE_SGLANG unset (the `sglang` tests
# skip, each saying why) and runs every other test. The last line of a CI run repeats the outcome
# (ci_sglang_last_line).
#
# Inputs (environment):
#   SRPO_GRAPH_SGLANG_CPU     the sglang-cpu folder (default ../shared/sglang-cpu)
#   SRPO_GRAPH_SGLANG_PYTHON  the SGLang venv's python (default ~/.cache/srpo-graph/sglang-venv/bin/python)
#   SRPO_GRAPH_CPUINFO        the CPU description read for the kernel target (default /proc/cpuinfo)
#   CI_LOGS                   a folder for the install's log and outcome (.ci/run's log folder)
#
# Use: ci_sglang_start (.ci/run runs it in the background: it installs, checks, and records in
# CI_LOGS whether SGLang is ready or why not), then ci_sglang_outcome (exports
# SRPO_GRAPH_REQUIRE_SGLANG=1 only where SGLang is ready, else prints the one line saying why not),
# and ci_sglang_last_line at the end of the run.

SRPO_GRAPH_SGLANG_CPU="${SRPO_GRAPH_SGLANG_CPU:-../shared/sglang-cpu}"
export SRPO_GRAPH_SGLANG_PYTHON="${SRPO_GRAPH_SGLANG_PYTHON:-$HOME/.cache/srpo-graph/sglang-venv/bin/python}"

# _ci_has " FLAGS " NAME...: whether every NAME is one of the space-separated FLAGS
_ci_has() {
  local flags="$1" f
  shift
  for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done
}

# ci_cpu_target [CPUINFO]: the SGLang CPU kernel build this CPU takes, by the rule of
# ../shared/sglang-cpu/install.sh (step 5; tests/test_ci_sglang.py checks the two name the same
# flags): x86-64-v4 (AVX-512 + AMX), x86-64-v3 (AVX2 and the rest of x86-64-v3) or none.
ci_cpu_target() {
  local cpuinfo="${1:-${SRPO_GRAPH_CPUINFO:-/proc/cpuinfo}}" flags
  flags=" $(grep -E '^flags[[:space:]]*:' "$cpuinfo" 2>/dev/null | head -1 | cut -d: -f2- || true) "
  if _ci_has "$flags" avx512f avx512_bf16 amx_tile amx_bf16; then
    echo x86-64-v4
  elif _ci_has "$flags" avx2 fma f16c bmi2 movbe; then
    echo x86-64-v3
  else
    echo none
  fi
}

# ci_cpu_target_line: the log line naming the CPU and its kernel target
ci_cpu_target_line() {
  local target model why
  target="$(ci_cpu_target)"
  model="$(grep -m1 -E '^model name' "${SRPO_GRAPH_CPUINFO:-/proc/cpuinfo}" 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)"
  case "$target" in
    x86-64-v4) why="AVX-512 + AMX: SGLang's AMX kernel build" ;;
    x86-64-v3) why="AVX2 without AVX-512 + AMX: the x86-64-v3 kernel build, SGLang's plain-torch CPU paths" ;;
    *) why="neither AVX-512 + AMX nor AVX2: no SGLang CPU kernel build runs here" ;;
  esac
  echo "ci: CPU ${model:-unknown}: SGLang kernel target $target ($why)"
}

# ci_sglang_imports: why the SGLang venv's python cannot import what the server imports (torch,
# sglang, sgl_kernel with its CPU ops), or nothing (status 0) when it can
ci_sglang_imports() {
  local py="$SRPO_GRAPH_SGLANG_PYTHON" rc=0 err
  [ -x "$py" ] || { echo "$py does not exist"; return 1; }
  err="$(SGLANG_USE_CPU_ENGINE=1 "$py" -c "import torch, sglang, sgl_kernel
assert hasattr(torch.ops.sgl_kernel, 'rmsnorm_cpu'), 'sgl_kernel has no CPU ops (rmsnorm_cpu)'" 2>&1)" || rc=$?
  [ "$rc" -eq 0 ] && return 0
  if [ "$rc" -eq 132 ]; then
    echo "importing sgl_kernel dies with SIGILL (rc 132): its build does not fit this CPU"
  else
    echo "importing torch, sglang, sgl_kernel fails (rc $rc): $(printf '%s\n' "$err" | tail -1)"
  fi
  return 1
}

# _ci_sglang_not_ready WHY: record that SGLang cannot run here, and why
_ci_sglang_not_ready() {
  echo "$1" >"$CI_LOGS/sglang.skipped"
}

# ci_sglang_install_key TARGET: what an install depends on -- every file of the sglang-cpu folder
# (install.sh, its patches, its kernel wheels) and the kernel target -- as one line
ci_sglang_install_key() {
  echo "$1 $(cd "$SRPO_GRAPH_SGLANG_CPU" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
}

# ci_sglang_start: install SGLang with the sglang-cpu folder's install.sh and check its imports;
# 0 with $CI_LOGS/sglang.ready when a server can start, else 1 with the reason in
# $CI_LOGS/sglang.skipped. A venv that this same folder installed for this kernel target (its stamp,
# $venv/.srpo-graph-install: the install key, then the install's lines naming the kernel build) and
# that still imports is not installed again: install.sh re-checks every step of a finished install
# (~25 s of CI before the suite can start); anything else -- a changed folder, another CPU, a venv
# that no longer imports, a failed install -- installs as before.
ci_sglang_start() {
  local t0 log venv target why stamp key
  t0=$(date +%s)
  log="$CI_LOGS/sglang-install.log"
  rm -f "$CI_LOGS/sglang.skipped" "$CI_LOGS/sglang.ready"
  if [ ! -f "$SRPO_GRAPH_SGLANG_CPU/install.sh" ]; then
    _ci_sglang_not_ready "$SRPO_GRAPH_SGLANG_CPU/install.sh not found"; return 1
  fi
  target="$(ci_cpu_target)"
  if [ "$target" = none ]; then
    _ci_sglang_not_ready "this CPU has neither AVX-512 + AMX nor AVX2: no SGLang CPU kernel build for it"; return 1
  fi
  venv="$(dirname "$(dirname "$SRPO_GRAPH_SGLANG_PYTHON")")"
  stamp="$venv/.srpo-graph-install"
  key="$(ci_sglang_install_key "$target")"
  if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$key" ] && ci_sglang_imports >/dev/null; then
    echo "ci: SGLang (CPU, kernel $target) is installed in $venv by this $SRPO_GRAPH_SGLANG_CPU/install.sh and imports: not installed again (its stamp: $stamp)"
    tail -n +2 "$stamp" | sed 's/^/ci: /'
    _ci_sglang_ready "$t0" "$log"
    return 0
  fi
  rm -f "$stamp"
  echo "ci: installing SGLang (CPU, kernel $target) with $SRPO_GRAPH_SGLANG_CPU/install.sh (log $log)"
  if ! VENV="$venv" bash "$SRPO_GRAPH_SGLANG_CPU/install.sh" >"$log" 2>&1; then
    # a failed step may still leave a venv whose imports work (a later optional check): the
    # imports decide; the install's own last lines say what failed
    if ! why="$(ci_sglang_imports)"; then
      _ci_sglang_not_ready "install.sh failed ($(grep -v '^[[:space:]]*$' "$log" | tail -1)) and $why (log $log)"
      return 1
    fi
    echo "ci: install.sh failed (see $log), but SGLang and its CPU kernels import: going on"
  elif ! why="$(ci_sglang_imports)"; then
    _ci_sglang_not_ready "$why (log $log)"; return 1
  else  # a clean install that imports: stamp it
    { echo "$key"; grep -E 'sglang-kernel-cpu for|kernel wheel:' "$log" || true; } >"$stamp"
  fi
  grep -E 'sglang-kernel-cpu for|kernel wheel:' "$log" | sed 's/^/ci: /' || true
  _ci_sglang_ready "$t0" "$log"
}

# _ci_sglang_ready T0 LOG: the router package, then the ready line and $CI_LOGS/sglang.ready
_ci_sglang_ready() {
  local t0="$1" log="$2" venv
  venv="$(dirname "$(dirname "$SRPO_GRAPH_SGLANG_PYTHON")")"
  # several servers behind one URL (tests/backends/test_sglang_real.py::test_router_...)
  "$SRPO_GRAPH_SGLANG_PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('sglang_router') is None)" >/dev/null 2>&1 ||
    "$SRPO_GRAPH_SGLANG_PYTHON" -m pip install -q -c "$venv/sglang-cpu-constraints.txt" sglang-router >>"$log" 2>&1 ||
    echo "ci: pip install sglang-router failed (see $log); the router test will fail"
  echo "ci: SGLang ready in $(( $(date +%s) - t0 )) s: $("$SRPO_GRAPH_SGLANG_PYTHON" -c 'from importlib.metadata import version; print("sglang", version("sglang"))' 2>/dev/null)"
  touch "$CI_LOGS/sglang.ready"
}

# ci_sglang_outcome: after ci_sglang_start, export SRPO_GRAPH_REQUIRE_SGLANG=1 where SGLang is
# ready, else print the one line saying why the `sglang` tests will skip
ci_sglang_outcome() {
  if [ -f "$CI_LOGS/sglang.ready" ]; then
    export SRPO_GRAPH_REQUIRE_SGLANG=1
    return 0
  fi
  unset SRPO_GRAPH_REQUIRE_SGLANG
  # a set-up that stopped before it said why (killed, or a step outside its checks)
  [ -f "$CI_LOGS/sglang.skipped" ] ||
    _ci_sglang_not_ready "the SGLang set-up stopped before it was ready (see $CI_LOGS/sglang-install.log)"
  echo "ci: no SGLang on this machine: $(cat "$CI_LOGS/sglang.skipped"); the real-SGLang tests (marker sglang) skip, every other test runs"
}

# ci_sglang_last_line: whether the real-SGLang tests ran, for the last line of a CI run
ci_sglang_last_line() {
  if [ -f "$CI_LOGS/sglang.skipped" ]; then
    echo "SGLang tests skipped ($(cat "$CI_LOGS/sglang.skipped"))"
  elif [ -n "${SRPO_GRAPH_REQUIRE_SGLANG:-}" ]; then
    echo "SGLang tests ran (kernel target $(ci_cpu_target), SRPO_GRAPH_REQUIRE_SGLANG=1)"
  else
    echo "SGLang tests not reached (CI stopped before the test suite)"
  fi
}
