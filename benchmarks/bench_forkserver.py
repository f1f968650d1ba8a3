"""A ``--nproc 2`` job's start: the ranks' forkserver forked from torchrun's wrapper vs started as a new
interpreter.

Both ways the ranks are forked from a server that has imported torch, transformers' modeling code and
the trainer (Note [Ranks forked from a preloaded server], srpo_graph/train/parallel/forked.py). The
baseline (``SRPO_GRAPH_FORKSERVER=exec``) is multiprocessing's own server, a new interpreter that
imports them while the wrapper has imported torch for torchrun already; the default forks the server
from the wrapper once it has imported them (Note [The forkserver is forked]). Each run is
``srpo-graph train workflows/coord_seq.wf --nproc 2 --steps 2 strategy=ddp`` on the tiny model,
alternating, ``--repeats`` times: its wall time, and the CPU of every process of the job -- the
launcher, torchrun's wrapper, the forkserver (which its parent never reaps) and the ranks -- counted
in a cgroup of its own (cgroup v1 ``cpuacct``; where none can be made, the machine's ``/proc/stat``,
on an idle machine).

Writes its section of docs/performance.md (``forkserver``) and benchmarks/results/forkserver.json.

Usage: ``python benchmarks/bench_forkserver.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
ARGS = ["rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", "checkpoint.every=1",
        "logging.tensorboard=false", "logging.plots=false", "logging.traces_every=0", "logging.progress=false",
        "strategy=ddp"]
WAYS = {"a new interpreter (`SRPO_GRAPH_FORKSERVER=exec`)": "exec", "forked from the wrapper (default)": "fork"}


def _machine_cpu() -> float:
    """CPU-seconds the machine has spent busy (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _cgroup(name: str) -> Path | None:
    """A new cpuacct cgroup, or None where none can be made."""
    group = CPUACCT / name
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def run_once(way: str, tmp: Path, index: int) -> tuple[float, float]:
    """One job: (wall s, CPU-s of its processes)."""
    run = tmp / f"run-{way}-{index}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "SRPO_GRAPH_FORKSERVER": way}
    cmd = [sys.executable, "-m", "srpo_graph.cli", "train", str(ROOT / "workflows" / "coord_seq.wf"), "--nproc",
           "2", "--steps", "2", "--run-dir", str(run), *ARGS]
    group = _cgroup(f"srpo-bench-forkserver-{os.getpid()}-{index}-{way}")
    if group is not None:  # the job's first process joins the cgroup before it execs; its descendants follow
        cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *cmd]
    before = _machine_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({way}):\n{proc.stderr[-3000:]}")
    if group is None:
        return wall, _machine_cpu() - before
    deadline = time.monotonic() + 30  # the forkserver ends when its last client has
    while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    group.rmdir()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in WAYS}
    counted = "its cgroup" if _cgroup_ok() else "the machine's /proc/stat"
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, way in WAYS.items():
                runs[name].append(run_once(way, Path(tmp), i))
                shutil.rmtree(Path(tmp) / f"run-{way}-{i}", ignore_errors=True)
                print(f"{i + 1}/{args.repeats} {way}: {runs[name][-1][0]:.2f} s, {runs[name][-1][1]:.2f} CPU-s",
                      flush=True)
    med = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
           for name, rs in runs.items()}
    base_wall, base_cpu = med[next(iter(WAYS))]
    lines = [
        "## A `--nproc 2` job: the ranks' forkserver forked from torchrun's wrapper "
        "(`benchmarks/bench_forkserver.py`)",
        "",
        f"{machine()}; `srpo-graph train workflows/coord_seq.wf --nproc 2 --steps 2 strategy=ddp` on the tiny "
        f"model (2 tasks x 2 samples a step), median of {args.repeats} jobs each way, alternating. **CPU**: every "
        f"process of the job (launcher, torchrun's wrapper, forkserver, ranks), counted in {counted}. Both ways "
        "the ranks are forked from a server that imported torch, transformers' modeling code and the trainer; "
        "forked from the wrapper, that server does not import torch a second time (Note [The forkserver is "
        "forked]).",
        "",
        "| the forkserver | job wall | job CPU | vs a new interpreter (time, CPU) |",
        "|---|---:|---:|---:|",
    ]
    for name, (wall, cpu) in med.items():
        lines.append(f"| {name} | {wall:.2f} s | {cpu:.2f} CPU-s | {base_wall / wall:.2f}x, {base_cpu / cpu:.2f}x |")
    write_section("forkserver", "\n".join(lines), after="bytecode")
    write_result("forkserver", {WAYS[name]: {"wall_s": m[0], "cpu_s": m[1]} for name, m in med.items()})
    print("\n".join(lines))


def _cgroup_ok() -> bool:
    group = _cgroup(f"srpo-bench-forkserver-{os.getpid()}-probe")
    if group is None:
        return False
    group.rmdir()
    return True


if __name__ == "__main__":
    main()
