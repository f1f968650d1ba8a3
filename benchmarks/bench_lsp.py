"""Diagnostics latency of ``srpo-graph lsp`` after an edit, on the largest shipped workflow.

A real server over stdio (the pygls client), debounce 0 so the number is the server's own
latency: the time from sending ``textDocument/didChange`` to receiving the
``publishDiagnostics`` of that version. Two kinds of edit, alternated: a character typed into a
prompt (the file still checks) and a typo in a consumed agent's name (an error appears). The
baselines in the same run: the analysis alone in process (parse + check + index,
:func:`srpo_graph.lsp.document.analyze`) and what a user without the editor runs,
``srpo-graph check --no-import --no-tokens`` as a process. The editor adds its debounce
(default 0.15 s) before this latency.

Run: ``python benchmarks/bench_lsp.py [--edits 40]`` (about 20 s; writes its section of
docs/performance.md and benchmarks/results/lsp.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._perfdoc import write_result, write_section  # noqa: E402
from srpo_graph.lsp.document import analyze  # noqa: E402


def largest_workflow() -> Path:
    return max((ROOT / "workflows").rglob("*.wf"), key=lambda p: p.stat().st_size)


def edits(text: str, n: int) -> list[tuple[str, str]]:
    """``n`` edited versions of ``text``: (kind, text), alternating a typed character in the first
    prompt and a typo in the first consumed name."""
    opening = re.search(r'prompt:\s*("""|")', text)
    assert opening is not None, "the workflow has no prompt"
    prompt_at = opening.end()
    consume_at = text.index("consume: ") + len("consume: ")
    out = []
    for k in range(n):
        if k % 2 == 0:
            out.append(("typed a character in a prompt", text[:prompt_at] + "x" * (k // 2 + 1) + text[prompt_at:]))
        else:
            out.append(("typo in a consumed name (an error)", text[:consume_at] + "z" + text[consume_at:]))
    return out


async def server_latency(path: Path, versions: list[tuple[str, str]]) -> dict[str, list[float]]:
    client = LanguageClient("bench-lsp", "1")
    arrived: dict[int, asyncio.Future] = {}

    @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_publish(params: lsp.PublishDiagnosticsParams) -> None:
        fut = arrived.get(params.version or -1)
        if fut is not None and not fut.done():
            fut.set_result((time.perf_counter(), len(params.diagnostics)))

    await client.start_io(sys.executable, "-m", "srpo_graph.cli", "lsp")
    await client.initialize_async(lsp.InitializeParams(capabilities=lsp.ClientCapabilities(),
                                                       initialization_options={"debounce": 0}))
    client.initialized(lsp.InitializedParams())
    uri = path.resolve().as_uri()
    loop = asyncio.get_running_loop()
    arrived[1] = loop.create_future()
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(text_document=lsp.TextDocumentItem(
        uri=uri, language_id="wf", version=1, text=path.read_text(encoding="utf-8"))))
    await asyncio.wait_for(arrived[1], 60)
    out: dict[str, list[float]] = {}
    for version, (kind, text) in enumerate(versions, start=2):
        arrived[version] = loop.create_future()
        t0 = time.perf_counter()
        client.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))
        t1, num_diags = await asyncio.wait_for(arrived[version], 60)
        assert (num_diags > 0) == kind.startswith("typo"), (kind, num_diags)
        out.setdefault(kind, []).append(t1 - t0)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return out


def in_process(path: Path, versions: list[tuple[str, str]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    analyze(path.read_text(encoding="utf-8"), str(path))  # warm: the grammar is built once
    for kind, text in versions:
        t0 = time.perf_counter()
        analyze(text, str(path))
        out.setdefault(kind, []).append(time.perf_counter() - t0)
    return out


def check_process(path: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "srpo_graph.cli", "check", "--no-import", "--no-tokens", str(path)],
                       capture_output=True, check=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return times


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"{1000 * statistics.median(xs):.1f} | {1000 * p90:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edits", type=int, default=40, help="edits sent to the server (half of each kind)")
    ap.add_argument("--check-runs", type=int, default=3, help="runs of `srpo-graph check` as a process")
    args = ap.parse_args()
    path = largest_workflow()
    versions = edits(path.read_text(encoding="utf-8"), args.edits)
    served = asyncio.run(server_latency(path, versions))
    local = in_process(path, versions)
    cli = check_process(path, args.check_runs)
    rel = path.relative_to(ROOT)
    load = os.getloadavg()[0]  # this machine is shared: the latency grows with what else runs
    cores = os.cpu_count()
    rows = ["| measured | edits | median ms | p90 ms |", "|---|---|---|---|"]
    for kind in served:
        rows.append(f"| server: didChange -> publishDiagnostics, {kind} | {len(served[kind])} | {ms(served[kind])} |")
    for kind in local:
        rows.append(f"| in process: parse + check + index, {kind} | {len(local[kind])} | {ms(local[kind])} |")
    rows.append(f"| baseline: `srpo-graph check --no-import --no-tokens` as a process | {len(cli)} | {ms(cli)} |")
    all_served = [x for xs in served.values() for x in xs]
    ratio = statistics.median(cli) / statistics.median(all_served)
    body = (f"## Editor: diagnostics latency after an edit (benchmarks/bench_lsp.py)\n\n"
            f"`srpo-graph lsp` over stdio on the largest shipped workflow, `{rel}` "
            f"({path.stat().st_size} bytes), debounce 0 (the editor waits `debounce`, default 150 ms, "
            f"after the last keystroke, then this). Goal: well under 100 ms. Load average {load:.1f} on "
            f"{cores} cores during the run.\n\n" + "\n".join(rows) +
            f"\n\nThe server answers an edit {ratio:.0f}x faster than a `check` process "
            f"(median {1000 * statistics.median(all_served):.1f} ms vs {1000 * statistics.median(cli):.0f} ms): "
            "it parses and checks in a warm process, with the grammar built once.\n")
    print(body)
    write_section("lsp", body)
    write_result(
        "lsp",
        {
            "workflow": str(rel),
            "load_average": load,
            "server_median_ms": 1000 * statistics.median(all_served),
            "in_process_median_ms": 1000 * statistics.median([x for xs in local.values() for x in xs]),
            "check_process_median_ms": 1000 * statistics.median(cli),
        },
    )


if __name__ == "__main__":
    main()
