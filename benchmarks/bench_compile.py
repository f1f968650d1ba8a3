"""Compile throughput and packing density vs a TRL-style padded batch.

Run: ``python benchmarks/bench_compile.py [--tasks 64 --samples 8]``. Measures, in one run:

* ``compile()`` throughput in tokens/s on synthetic traces shaped like a multi-agent run
  (set sizes 1..5, prompts 50..300 tokens, completions 10..200), including validation;
* the time to build the padded tensors TRL would build from the same outputs (prompts padded
  left, completions right, to the longest in the batch), as the baseline;
* the share of slots that hold real tokens: packed (always 100%) vs padded.

Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import time

import torch
from _perfdoc import machine, write_result, write_section

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.summary import padded_slots
from srpo_graph.compiler.synthetic import synthetic_episodes


def padded_like_trl(episodes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """prompt_ids [B, P] (left-padded), completion_ids [B, C] (right-padded), masks, as TRL's GRPOTrainer."""
    outs = [o for ep in episodes for t in ep.transitions for o in ep.outputs if o.id in t.consumed]
    P = max(len(o.prompt_ids) for o in outs)
    C = max(len(o.completion_ids) for o in outs)
    prompt = torch.zeros(len(outs), P, dtype=torch.int64)
    comp = torch.zeros(len(outs), C, dtype=torch.int64)
    pmask = torch.zeros(len(outs), P, dtype=torch.bool)
    cmask = torch.zeros(len(outs), C, dtype=torch.bool)
    for i, o in enumerate(outs):
        p, c = len(o.prompt_ids), len(o.completion_ids)
        prompt[i, P - p:] = torch.tensor(o.prompt_ids)
        pmask[i, P - p:] = True
        comp[i, :c] = torch.tensor(o.completion_ids)
        cmask[i, :c] = True
    return prompt, comp, pmask, cmask


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    eps = synthetic_episodes(args.tasks, args.samples, seed=0, max_set=5, max_events=4,
                             prompt_len=(50, 300), completion_len=(10, 200), vocab=30000)
    t_compile, batch = best_of(lambda: compile(eps, CompileConfig(micro_batch_tokens=16384)), args.repeat)
    t_pad, padded = best_of(lambda: padded_like_trl(eps), args.repeat)
    tokens = batch.num_tokens
    slots = padded_slots(batch)
    assert slots == padded[0].numel() + padded[1].numel()
    rows = [
        ("episodes / events / members", f"{len(eps)} / {batch.num_sets} / {batch.num_members}"),
        ("tokens (prompt + completion)", f"{tokens:,}"),
        ("compile() time (validate + advantages + pack)", f"{t_compile * 1e3:.1f} ms"),
        ("compile() throughput", f"{tokens / t_compile / 1e6:.2f} M tokens/s"),
        ("TRL-style padded build time (baseline)", f"{t_pad * 1e3:.1f} ms"),
        ("compile time / padded build time", f"{t_compile / t_pad:.2f}x"),
        ("slots: packed / padded", f"{tokens:,} / {slots:,}"),
        ("real-token share: packed vs padded", f"100% vs {100 * tokens / slots:.1f}%"),
        ("padded slots per real token", f"{slots / tokens:.2f}x"),
    ]
    body = "\n".join([
        "## Compiler: packing (benchmarks/bench_compile.py)",
        "",
        f"Synthetic traces: {args.tasks} tasks x {args.samples} samples, set sizes 1-5, prompts 50-300 and "
        f"completions 10-200 tokens; best of {args.repeat}; {machine()}.",
        "",
        "| quantity | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ])
    print(body)
    write_section("compile", body)
    write_result("compile", {"compile_s": t_compile, "padded_s": t_pad, "ratio": t_compile / t_pad, "tokens": tokens})


if __name__ == "__main__":
    main()
