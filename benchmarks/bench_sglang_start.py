"""A real SGLang CPU server's start: the cpu recipe (its scheduler and detokenizer forked,
``srpo_graph/backends/sglang_cpu_main.py``) vs SGLang's own entry point (spawned), side by side.

Both launch the same flags on the same model (``--model``, default the tiny model that
scripts/setup.sh builds) through ``SGLangServer``, alternating, ``--repeats`` times each:

* **to healthy**: from the launch to the first ``/health`` answer (which generates a token), as
  ``SGLangServer.wait_healthy`` sees it;
* **server CPU**: the user + system CPU of every process of the server's process group (the
  launcher, the scheduler, the detokenizer), read from /proc once it is healthy, before the stop.

Writes its section of docs/performance.md (``sglang-start``) and benchmarks/results/sglang_start.json.

Usage: ``python benchmarks/bench_sglang_start.py [--repeats 3] [--model DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

from srpo_graph.backends.ports import claim_ports  # noqa: E402
from srpo_graph.backends.sglang_server import CPU_MAIN, CPU_TEMPLATE, SGLangServer, launch_command, recipe_env  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# SGLang's own entry point with the cpu recipe's flags: what the recipe was before it forked
SPAWNED = CPU_TEMPLATE.replace(str(CPU_MAIN), "-m sglang.launch_server")
assert SPAWNED != CPU_TEMPLATE, "the cpu recipe no longer names sglang_cpu_main.py"
WAYS = {"cpu recipe (forked)": "cpu", "sglang.launch_server (spawned)": SPAWNED}


def group_cpu(pgid: int) -> tuple[float, int]:
    """CPU-s used so far by the live processes of process group ``pgid``, and how many there are."""
    total, count = 0.0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 of stat, counted after the name
            total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
            count += 1
    return total, count


def start_once(recipe: str, model: str, logs: Path) -> tuple[float, float, int]:
    (port,) = claim_ports(1)
    server = SGLangServer(launch_command(recipe, model, port), port, log_path=logs / f"sglang-{port}.log",
                          env=recipe_env("cpu"))
    t0 = time.perf_counter()
    server.start()
    try:
        server.wait_healthy(300)
        wall = time.perf_counter() - t0
        cpu, processes = group_cpu(server.pid)
    finally:
        server.stop()
    return wall, cpu, processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=str(Path.home() / ".cache" / "srpo-graph" / "tiny"))
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float, int]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as logs:
        for i in range(args.repeats):
            for way, recipe in WAYS.items():
                wall, cpu, processes = start_once(recipe, args.model, Path(logs))
                runs[way].append((wall, cpu, processes))
                print(f"{i + 1}/{args.repeats} {way}: {wall:.1f} s, {cpu:.1f} CPU-s", flush=True)
    med = {way: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs), rs[0][2])
           for way, rs in runs.items()}
    base_wall, base_cpu, _ = med["sglang.launch_server (spawned)"]
    lines = [
        "## A real SGLang CPU server's start: forked vs spawned (`benchmarks/bench_sglang_start.py`)",
        "",
        f"{machine()}; model `{Path(args.model).name}`; median of {args.repeats} starts each, alternating. "
        "**To healthy**: launch to the first `/health` answer (it generates a token). **Server CPU**: "
        "user + system CPU of the server's process group (launcher, scheduler, detokenizer) once healthy. "
        "Same flags both ways; the cpu recipe runs `srpo_graph/backends/sglang_cpu_main.py`, which forks "
        "SGLang's scheduler and detokenizer from the launcher's imported modules (Note [The cpu recipe "
        "forks SGLang's processes]).",
        "",
        "| entry point | to healthy | server CPU | processes | vs spawned (time, CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for way, (wall, cpu, processes) in med.items():
        lines.append(f"| {way} | {wall:.1f} s | {cpu:.1f} CPU-s | {processes} | "
                     f"{base_wall / wall:.2f}x, {base_cpu / cpu:.2f}x |")
    write_section("sglang-start", "\n".join(lines))
    write_result("sglang_start", {way: {"healthy_s": m[0], "cpu_s": m[1]} for way, m in med.items()})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
