"""The prefix-cache flush after a weight sync, on a real SGLang CPU server: ``/flush_cache`` vs the update's own.

After new weights a server's prefix cache holds KV of the old ones, so every sync flushes it
(Note [The update flushes the cache], backends/weight_sync.py). Two ways, both against one real
server of the tiny model that scripts/setup.sh builds, loading the same weights from its folder:

* **update + /flush_cache** (srpo-graph before this change): ``/update_weights_from_disk`` with
  ``flush_cache: false``, then ``/flush_cache?timeout=T``. On CPU that route also runs
  ``gc.collect()`` over the scheduler's heap (SGLang's ``CpuDeviceMixin.empty_cache``);
* **the update flushes**: ``/update_weights_from_disk`` with ``flush_cache: true,
  torch_empty_cache: false``, what ``SGLangBackend.sync_weights`` sends now.

Per way, median of ``--repeats`` alternating rounds: the wall time of the calls and the server's CPU
(every process of its process group, from /proc). Each round first checks that the server had cached
the probe prompt and, after the sync, that it had not (both ways flush).

Writes its section of docs/performance.md (``sync-flush``) and benchmarks/results/sync_flush.json.

Usage: ``python benchmarks/bench_sync_flush.py [--repeats 9] [--model DIR]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402
from bench_sglang_start import group_cpu  # noqa: E402

from srpo_graph.backends.ports import claim_ports  # noqa: E402
from srpo_graph.backends.sglang_server import SGLangServer, launch_command, recipe_env  # noqa: E402

PROBE = list(range(3, 40))  # a prompt whose prefix the server caches


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--model", default=str(Path.home() / ".cache" / "srpo-graph" / "tiny"))
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"update + /flush_cache": [], "the update flushes": []}
    with tempfile.TemporaryDirectory() as logs:
        (port,) = claim_ports(1)
        server = SGLangServer(launch_command("cpu", args.model, port), port, log_path=Path(logs) / "sglang.log",
                              env=recipe_env("cpu"))
        server.start()
        client = httpx.Client(timeout=300)

        def post(route: str, body: dict) -> dict:
            answer = client.post(f"{server.url}{route}", json=body)
            answer.raise_for_status()
            return answer.json() if route != "/flush_cache?timeout=300" else {}

        def cached() -> int:
            out = post("/generate", {"input_ids": PROBE, "sampling_params": {"max_new_tokens": 1}})
            return int(out["meta_info"]["cached_tokens"])

        def update(flush: bool, version: int) -> None:
            out = post("/update_weights_from_disk", {"model_path": args.model, "weight_version": str(version),
                                                     "flush_cache": flush, "torch_empty_cache": False,
                                                     "abort_all_requests": False})
            assert out.get("success"), out

        ways = {
            "update + /flush_cache": lambda v: (update(False, v), post("/flush_cache?timeout=300", {})),
            "the update flushes": lambda v: update(True, v),
        }
        try:
            server.wait_healthy(300)
            version = 0
            for i in range(args.repeats + 1):  # the first round warms both ways and is not counted
                for way, fn in ways.items():
                    cached()
                    assert cached() > 0, "the server did not cache the probe prompt"
                    version += 1
                    s0, t0 = group_cpu(server.pid)[0], time.perf_counter()
                    fn(version)
                    wall, cpu = time.perf_counter() - t0, group_cpu(server.pid)[0] - s0
                    assert cached() == 0, f"{way}: the cache was not flushed"
                    if i:
                        runs[way].append((wall, cpu))
                        print(f"{i}/{args.repeats} {way}: {wall:.3f} s, server {cpu:.3f} CPU-s", flush=True)
        finally:
            client.close()
            server.stop()
    med = {way: tuple(statistics.median(r[k] for r in rs) for k in range(2)) for way, rs in runs.items()}
    base = med["update + /flush_cache"]
    lines = [
        "## The prefix-cache flush after a weight sync: `/flush_cache` vs the update's own "
        "(`benchmarks/bench_sync_flush.py`)",
        "",
        f"{machine()}; one real SGLang CPU server of `{Path(args.model).name}` (the cpu recipe), loading the same "
        f"weights from its folder; median of {args.repeats} alternating rounds, each checked: the probe prompt cached "
        "before the sync, not after. **update + /flush_cache**: `/update_weights_from_disk` (`flush_cache: false`), "
        "then `/flush_cache?timeout=T`, as `sync_weights` did; **the update flushes**: one "
        "`/update_weights_from_disk` with `flush_cache: true, torch_empty_cache: false`, as it does now (Note [The "
        "update flushes the cache]). Server CPU: its process group.",
        "",
        "| way | wall | server CPU | vs update + /flush_cache (wall) |",
        "|---|---:|---:|---:|",
    ]
    for way, (wall, cpu) in med.items():
        lines.append(f"| {way} | {wall:.3f} s | {cpu:.3f} CPU-s | {base[0] / wall:.1f}x |")
    saved = base[0] - med["the update flushes"][0]
    lines += ["", f"**Reading.** On CPU, `/flush_cache` runs a `gc.collect()` over the server's heap; the update's own "
              f"flush does not. ~{saved:.2f} s saved a sync, whatever the model's size (the update itself is the "
              f"same): ~{60 * saved:.0f} s over the 60 synced steps of the suite's slowest test (coord_par2 on the "
              "session's server), and the same share of every training step a user runs on a CPU server."]
    write_section("sync-flush", "\n".join(lines), after="sync")
    write_result("sync_flush", {way: {"wall_s": m[0], "server_cpu_s": m[1]} for way, m in med.items()})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
