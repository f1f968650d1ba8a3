"""A process's start with and without srpo-graph's bytecode on disk (``PYTHONDONTWRITEBYTECODE=1``).

Where ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's machines and CI) Python writes no
``__pycache__``: every process compiles each srpo-graph module it imports from source, again and
again -- a CI run starts ~300 of them. ``pip`` compiles the installed packages (torch, transformers)
at install time, but an editable install is the source tree itself, so scripts/setup.sh compiles it
once (``python -m compileall``), and every later process reads the bytecode instead.

Measured on a copy of the package (``PYTHONPATH``), with ``PYTHONDONTWRITEBYTECODE=1`` both ways,
alternating, ``--repeats`` times each; the CPU is the child's user + system time:

* **imports**: every module of the package, imported after torch and transformers (the CPU counted
  in the process, around those imports alone: the part the bytecode changes);
* **train**: ``srpo-graph train workflows/coord_par2.wf`` for one step of one task on the tiny model
  (what the suite's subprocess tests and torchrun's launchers start), the whole process.

Writes its section of docs/performance.md (``bytecode``) and benchmarks/results/bytecode.json.

Usage: ``python benchmarks/bench_bytecode.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "coord_par2.wf"


IMPORTS = """
import importlib, pkgutil, resource
import torch, transformers  # (pip compiled them at install: not what is measured)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0 = cpu()
import srpo_graph
for m in pkgutil.walk_packages(srpo_graph.__path__, "srpo_graph."):
    if not m.name.startswith(("srpo_graph.lsp", "srpo_graph.backends.sglang_cpu_main")):  # (extras, SGLang's venv)
        importlib.import_module(m.name)
print(srpo_graph.__file__, cpu() - c0)
"""


def train(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "srpo_graph.cli", "train", str(WORKFLOW), "--steps", "1", "--run-dir", str(run_dir),
            "rollout.tasks_per_step=1", "rollout.samples=2", "eval.every=0", "logging.plots=false",
            "logging.tensorboard=false"]


def child_cpu(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """The user + system CPU-s of one run of ``argv`` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def drop_bytecode(package: Path) -> None:
    for cache in package.rglob("__pycache__"):
        shutil.rmtree(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cpu: dict[tuple[str, str], list[float]] = {}
    runs = 0
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "src" / "srpo_graph"
        shutil.copytree(ROOT / "srpo_graph", package, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": str(package.parent), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
        for i in range(args.repeats):
            for way in ("from source", "bytecode on disk"):
                drop_bytecode(package)
                if way == "bytecode on disk":
                    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)
                runs += 1
                imports = subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True, capture_output=True,
                                         text=True, cwd=tmp)  # (not the checkout: '' is first on sys.path)
                where, used = imports.stdout.split()[-2:]
                assert Path(where).parent == package, f"imported {where}, not the copy"
                cpu.setdefault(("imports", way), []).append(float(used))
                cpu.setdefault(("train", way), []).append(child_cpu(train(Path(tmp) / f"run-{runs}"), env, Path(tmp)))
            done = ", ".join(f"{n} {w} {v[-1]:.2f}" for (n, w), v in cpu.items())
            print(f"{i + 1}/{args.repeats}: {done}", flush=True)
    med = {key: statistics.median(values) for key, values in cpu.items()}
    lines = [
        "## A process's start with srpo-graph's bytecode on disk (`benchmarks/bench_bytecode.py`)",
        "",
        f"{machine()}; `PYTHONDONTWRITEBYTECODE=1` both ways (as on this project's machines and CI: Python "
        "writes no `__pycache__`, so each process compiles every srpo-graph module it imports); median CPU "
        f"(user + system; min-max in brackets) of {args.repeats} runs each, alternating. scripts/setup.sh now "
        "compiles the source tree once (`python -m compileall`: pip compiles what it installs, but an editable "
        "install is the source itself). **imports**: every module of the package, after torch and transformers "
        "(the CPU of those imports alone, counted in the process); **train**: a whole `srpo-graph train "
        "workflows/coord_par2.wf` process, one step of one task on the tiny model.",
        "",
        "| what | from source | bytecode on disk | saved per process | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("imports", "train"):
        src, pyc = med[(name, "from source")], med[(name, "bytecode on disk")]
        a, b = (f"{min(cpu[(name, w)]):.2f}-{max(cpu[(name, w)]):.2f}" for w in ("from source", "bytecode on disk"))
        lines.append(f"| {name} | {src:.2f} CPU-s ({a}) | {pyc:.2f} CPU-s ({b}) | {src - pyc:.2f} CPU-s "
                     f"| {src / pyc:.2f}x |")
    saved = med[("imports", "from source")] - med[("imports", "bytecode on disk")]
    noise = max(max(v) - min(v) for (name, _), v in cpu.items() if name == "train")
    lines += ["", f"**Reading.** The imports row is the effect: {saved:.2f} CPU-s less for each process that imports "
              f"the whole package. A whole train process's CPU moved by up to {noise:.2f} CPU-s between runs of the "
              "same code here, more than that effect, so the train row cannot resolve it either way. Of the ~280 "
              "Python processes of a test run (the census in \"CI time\"), about half import srpo-graph (an estimate)."]
    write_section("bytecode", "\n".join(lines), after="sglang-start")
    write_result("bytecode", {f"{n} {w}": v for (n, w), v in med.items()})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
