"""The client's CPU per remote request: one shared pool of N connections vs a connection per thread
(``bounded_http.Session``, Note [A connection per thread]), side by side in one run.

The baseline is what ``bounded_http.client`` was before: one ``httpx.Client`` whose pool holds
``concurrency`` connections, with the same deadline-bounded network backend. Both are driven by the
same pool of threads, as ``SGLangBackend.generate`` drives them.

* ``local``: a real HTTP/1.1 server in another process (``http.server``, a small JSON answer), so
  the CPU measured (this process's) is the client's alone;
* ``--sglang``: the real SGLang CPU server on the tiny model, ``SGLangBackend.generate`` of
  ``--requests`` requests of 4 new tokens, the backend's own client swapped for the baseline;
* ``--train STEPS``: on that server, ``workflows/coord_par2.wf`` trained STEPS steps (connected,
  weights streamed; 128 requests a step as the streaming scheduler sends them), each client in turn
  (``bounded_http.client`` swapped for the baseline): the trainer process's CPU and the wall time.

Writes its section of docs/performance.md (``http-client``) and benchmarks/results/http_client.json.

Usage: ``python benchmarks/bench_http_client.py [--requests 2048] [--threads 64] [--sglang]``
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

from srpo_graph.backends import bounded_http  # noqa: E402

SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"output_ids": [1, 2, 3, 4], "meta_info": {"output_token_logprobs": [[-0.1, 1], [-0.2, 2]]}}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H); s.daemon_threads = True
print(s.server_address[1], flush=True); s.serve_forever()
"""


def shared_pool(concurrency: int):
    """The baseline: one client, a pool of ``concurrency`` connections, the bounded backend."""
    import httpx

    made = httpx.Client(limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency))
    made._transport._pool._network_backend = bounded_http._backend(made._transport._pool._network_backend)
    return made


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drive(session, url: str, n: int, threads: int) -> tuple[float, float]:
    """(client CPU ms, wall ms) per request of ``n`` POSTs from ``threads`` threads."""
    def one(_):
        return bounded_http.call(session, "POST", url, json={"input_ids": list(range(32))}, timeout=60,
                                 max_bytes=1 << 20).status

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads * 2)))  # connections made, threads started
        c0, t0 = cpu(), time.perf_counter()
        assert set(pool.map(one, range(n))) == {200}
        return (cpu() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3


def local(n: int, threads: int, repeats: int) -> list[tuple[str, float, float]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}/generate"
        rows = []
        for name, make in (("shared pool (before)", lambda: shared_pool(threads)),
                           ("connection per thread", lambda: bounded_http.client(concurrency=threads))):
            runs = []
            for _ in range(repeats):
                session = make()
                runs.append(drive(session, url, n, threads))
                session.close()
            rows.append((name, min(r[0] for r in runs), min(r[1] for r in runs)))
        return rows
    finally:
        proc.kill()


def sglang(n: int, threads: int) -> list[tuple[str, float, float]]:
    from srpo_graph.backends import load_backend
    from srpo_graph.backends.base import GenerationRequest
    from srpo_graph.backends.ports import claim_ports
    from srpo_graph.backends.sglang_server import start_server

    tiny = Path.home() / ".cache" / "srpo-graph" / "tiny"
    server = start_server(str(tiny), claim_ports(1)[0], recipe="cpu", log_path="/tmp/bench-http-sglang.log")
    try:
        backend = load_backend("sglang", str(tiny), url=server.url, concurrency=threads)
        reqs = [GenerationRequest(request_id=f"r{i}", prompt_ids=tuple(range(5, 37)), max_new_tokens=4,
                                  temperature=1.0, top_p=1.0, top_k=0, stop_token_ids=(), seed=i) for i in range(n)]
        rows = []
        for name, make in (("shared pool (before)", lambda: shared_pool(threads)),
                           ("connection per thread", lambda: bounded_http.client(concurrency=threads))):
            backend._client = make()
            backend.generate(reqs[: threads * 2])
            c0, t0 = cpu(), time.perf_counter()
            backend.generate(reqs)
            rows.append((name, (cpu() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3))
            backend._client.close()
        return rows
    finally:
        server.stop()


def train_steps(steps: int) -> list[tuple[str, float, float]]:
    import json
    import shutil
    import tempfile

    import torch

    from srpo_graph.backends.ports import claim_ports
    from srpo_graph.backends.sglang_server import start_server
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.trainer import train

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-http-train-"))
    tiny = root / "tiny"
    shutil.copytree(Path.home() / ".cache" / "srpo-graph" / "tiny", tiny)
    server = start_server(str(tiny), claim_ports(1)[0], recipe="cpu", log_path=root / "sglang.log")
    made = bounded_http.client
    rows = []
    try:
        for name, make in (("warm-up (imports, not reported)", made),
                           ("shared pool (before)", lambda concurrency=16, headers=None: shared_pool(concurrency)),
                           ("connection per thread", made)):
            bounded_http.client = make  # type: ignore[assignment]
            run = root / name.split()[0]
            n = 1 if name.startswith("warm-up") else steps
            cfg = load_config(None, [f"steps={n}", f"run_dir={json.dumps(str(run))}", "rollout.backend=sglang",
                                     f"rollout.sglang.url={json.dumps(server.url)}",
                                     "rollout.sglang.update_connected=true", "eval.every=0",
                                     "logging.tensorboard=false", "logging.progress=false", "logging.plots=false",
                                     f'rollout.models={{"*"={json.dumps(str(tiny))}}}'])
            c0, t0 = cpu(), time.perf_counter()
            train(Path(__file__).resolve().parents[1] / "workflows" / "coord_par2.wf", cfg)
            if not name.startswith("warm-up"):
                rows.append((name, (cpu() - c0) / steps * 1e3, (time.perf_counter() - t0) / steps * 1e3))
            # the next run starts from the base weights again
            from srpo_graph.backends import load_backend

            b = load_backend("sglang", str(tiny), url=server.url, sync="disk", weight_dir=root / "reset")
            b.sync_weights(str(tiny), 0)
            b.close()
    finally:
        bounded_http.client = made  # type: ignore[assignment]
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=64, help="threads and connections (SGLangBackend's default: 64)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sglang", action="store_true", help="also on the real SGLang CPU server")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS", help="also train STEPS steps on it, each client")
    a = ap.parse_args()
    parts = {"local": local(a.requests, a.threads, a.repeats)}
    if a.sglang:
        parts["sglang"] = sglang(a.requests, a.threads)
    if a.train:
        parts[f"sglang, training ({a.train} steps, per step)"] = train_steps(a.train)
    lines = ["## The HTTP client's CPU per request (`benchmarks/bench_http_client.py`)", "",
             f"{a.requests} requests from {a.threads} threads, one run, {machine()}. Baseline: one `httpx` pool "
             f"of {a.threads} connections (the client before Note [A connection per thread]); CPU is the "
             "client process's only (the server runs in another process); in the training rows it is the "
             "trainer's (client, rollout scheduler, learning and sync), per step, after a warm-up run.", "",
             "| server | client | CPU ms / request (step) | wall ms / request (step) | CPU vs baseline |",
             "|---|---|---|---|---|"]
    result = {}
    for part, rows in parts.items():
        base = rows[0][1]
        for name, c, w in rows:
            lines.append(f"| {part} | {name} | {c:.2f} | {w:.2f} | {c / base:.2f}x |")
            result[f"{part}/{name}"] = {"cpu_ms": round(c, 3), "wall_ms": round(w, 3)}
    lines += ["", "Why (a profile of 15 training steps on the SGLang server, yappi, CPU clock): with one pool "
              "httpcore assigns every queued request by scanning all connections and polls each idle one's "
              "socket (`is_socket_readable`), so a request costs O(connections) of Python and syscalls; "
              "a thread's own connection is O(1). Each weight-sync control call also made a new client, "
              "and with it a TLS context (~20 ms of CPU loading the CA bundle); one context now serves "
              "every client of the process."]
    print("\n".join(lines))
    write_section("http-client", "\n".join(lines))
    write_result("http_client", result)


if __name__ == "__main__":
    main()
