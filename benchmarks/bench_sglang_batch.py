"""One step's short requests to a real SGLang CPU server: one ``/generate`` call each vs one batched call.

A rollout step of ``workflows/coord_par2.wf`` is 256 one-token requests, and
``SGLangBackend.generate`` sends each as its own ``/generate`` call (on its pool of keep-alive
connections, Note [A connection per thread]). SGLang also takes a list in one call
(``input_ids`` and ``sampling_params`` as lists; the answer is a list in the same order). This
measures what the per-call HTTP costs, on the tiny model that scripts/setup.sh builds:

* **one per call**: ``--requests`` calls on ``--threads`` threads of one ``httpx`` client, as the
  backend sends them;
* **a call per wave of 2**: the requests in pairs, one batched call each on the same threads --
  what ``SGLangBackend.generate_together`` sends for coord_par2's waves of two agents (Note [A wave
  in one call]);
* **batched**: the same requests in one call.

Per way, median of ``--repeats`` alternating rounds: the wall time, the client's CPU (this
process) and the server's (every process of its process group, from /proc).

Writes its section of docs/performance.md (``sglang-batch``) and benchmarks/results/sglang_batch.json.

Usage: ``python benchmarks/bench_sglang_batch.py [--requests 256] [--threads 8] [--repeats 5] [--model DIR]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402
from bench_sglang_start import group_cpu  # noqa: E402

from srpo_graph.backends.ports import claim_ports  # noqa: E402
from srpo_graph.backends.sglang_server import SGLangServer, launch_command, recipe_env  # noqa: E402

# what SGLangBackend.payload sends for a one-token sample (backends/sglang.py)
PARAMS = {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "stop_token_ids": [],
          "skip_special_tokens": False, "no_stop_trim": True}


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=str(Path.home() / ".cache" / "srpo-graph" / "tiny"))
    args = parser.parse_args()
    prompts = [[1, 5 + i % 10, 7] for i in range(args.requests)]
    runs: dict[str, list[tuple[float, float, float]]] = {"one per call": [], "a call per wave of 2": [],
                                                          "batched": []}
    with tempfile.TemporaryDirectory() as logs:
        (port,) = claim_ports(1)
        server = SGLangServer(launch_command("cpu", args.model, port), port, log_path=Path(logs) / "sglang.log",
                              env=recipe_env("cpu"))
        server.start()
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=args.threads))
        pool = ThreadPoolExecutor(args.threads)

        def post(body: dict) -> object:
            answer = client.post(f"{server.url}/generate", json=body)
            answer.raise_for_status()
            return answer.json()

        def one_per_call() -> list:
            return list(pool.map(lambda p: post({"input_ids": p, "sampling_params": PARAMS, "return_logprob": True}),
                                 prompts))

        def batch(group: list) -> list:
            out = post({"input_ids": group, "sampling_params": [PARAMS] * len(group),
                        "return_logprob": [True] * len(group)})
            assert isinstance(out, list) and len(out) == len(group), "a batched call answers one item per request"
            return out

        def per_wave() -> list:
            return [a for pair in pool.map(batch, [prompts[i:i + 2] for i in range(0, len(prompts), 2)]) for a in pair]

        ways = {"one per call": one_per_call, "a call per wave of 2": per_wave, "batched": lambda: batch(prompts)}
        try:
            server.wait_healthy(300)
            for fn in ways.values():  # warm both paths once
                fn()
            for i in range(args.repeats):
                for way, fn in ways.items():
                    c0, s0, t0 = self_cpu(), group_cpu(server.pid)[0], time.perf_counter()
                    answers = fn()
                    wall = time.perf_counter() - t0
                    runs[way].append((wall, self_cpu() - c0, group_cpu(server.pid)[0] - s0))
                    assert all(len(a["output_ids"]) == 1 for a in answers)
                    print(f"{i + 1}/{args.repeats} {way}: {wall:.3f} s, client {runs[way][-1][1]:.3f} CPU-s, "
                          f"server {runs[way][-1][2]:.3f} CPU-s", flush=True)
        finally:
            pool.shutdown()
            client.close()
            server.stop()
    med = {way: tuple(statistics.median(r[k] for r in rs) for k in range(3)) for way, rs in runs.items()}
    base = med["one per call"]
    lines = [
        "## One step's short requests to a real SGLang server: one call each vs one batched call "
        "(`benchmarks/bench_sglang_batch.py`)",
        "",
        f"{machine()}; model `{Path(args.model).name}`, the cpu recipe; {args.requests} one-token requests (a "
        f"step of `coord_par2.wf`), median of {args.repeats} alternating rounds. **One per call**: a `/generate` "
        f"call per request on {args.threads} threads of one keep-alive client, as `SGLangBackend.generate` sends "
        "them; **a call per wave of 2**: the requests in pairs, a batched call each on the same threads, as "
        "`generate_together` sends coord_par2's waves; **batched**: the same requests as lists in one call. "
        "Client CPU: this process; server CPU: its process group.",
        "",
        "| way | wall | client CPU | server CPU | vs one per call (wall, CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for way, (wall, client_cpu, server_cpu) in med.items():
        lines.append(f"| {way} | {wall:.3f} s | {client_cpu:.3f} CPU-s | {server_cpu:.3f} CPU-s | "
                     f"{base[0] / wall:.2f}x, {(base[1] + base[2]) / (client_cpu + server_cpu):.2f}x |")
    def cpu(way: str) -> float:
        return med[way][1] + med[way][2]

    lines += ["", f"**Reading.** The server's work is mostly per call: a call per wave of 2 saves "
              f"~{cpu('one per call') - cpu('a call per wave of 2'):.1f} CPU-s a step of this shape (~"
              f"{60 * (cpu('one per call') - cpu('a call per wave of 2')):.0f} CPU-s over the 60 steps of the "
              "suite's slowest test, coord_par2 on the session's server); that is what the streaming scheduler "
              "sends now (Note [A wave in one call]). One call for the whole step would save "
              f"~{cpu('one per call') - cpu('batched'):.1f} CPU-s, but the waves of different episodes are not "
              "ready at one moment (an episode advances as soon as its own wave returns), a router in front of "
              "several servers spreads calls, not the items of one call, and a failed call fails every request "
              "in it: not taken."]
    write_section("sglang-batch", "\n".join(lines), after="sglang-start")
    write_result("sglang_batch", {way: {"wall_s": m[0], "client_cpu_s": m[1], "server_cpu_s": m[2]}
                                  for way, m in med.items()})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
