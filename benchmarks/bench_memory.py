"""Peak memory of log-probs + backward: a packed SetBatch micro-batch vs the same members padded.

Run: ``python benchmarks/bench_memory.py [--vocab 32000 --budget 4096]``. One micro-batch of
synthetic traces (set sizes 1..3, prompts 50..300 and completions 10..200 tokens, no token
constraints so every variant computes the same distributions) goes through a randomly
initialised Llama (built here, hidden 128, 2 layers, the given vocabulary) five ways:

* ``packed``: :func:`packed_logprobs` with ``layout="packed"`` (one row, positions restarting
  per member; hidden states gathered at completion positions before the lm_head, log-softmax
  over completion tokens only);
* ``padded layout``: :func:`packed_logprobs` with ``layout="padded"`` (the default with sdpa on
  CPU): length-bucketed right-padded rows, no attention mask, the same completion-only lm_head;
* ``packed, full logits``: the same with a model that does not take ``logits_to_keep``, so the
  lm_head runs on every token and the rows are gathered afterwards (round 1's behaviour);
* ``padded, TRL-style``: prompts left-padded and completions right-padded to the longest,
  a 2-D attention mask, ``logits_to_keep`` = longest completion + 1, and TRL's
  ``selective_log_softmax`` (gather minus a per-row logsumexp);
* ``padded, full logits``: the plain padded implementation, ``log_softmax`` over [B, L, V].

Each variant runs in its own subprocess, once: peak RSS during the step (``ru_maxrss``) minus
the resident size just before it. In the same run the bytes autograd saves for backward are
summed (``saved_tensors_hooks``, unique storages) and the vocabulary-sized blocks are
counted analytically (rows x vocab x 4 bytes). Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

VARIANTS = ("packed", "padded_layout", "packed_full_logits", "padded_trl", "padded_full")
LABELS = {
    "packed": "packed (SetBatch), lm_head on completion positions",
    "padded_layout": "padded layout (SetBatch; default on CPU), length buckets, lm_head on completion positions",
    "packed_full_logits": "packed (SetBatch), lm_head on every token",
    "padded_trl": "padded [B, L], TRL-style (logits_to_keep, selective log-softmax)",
    "padded_full": "padded [B, L], full log_softmax",
}


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _batch(args):
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.compiler.synthetic import synthetic_episodes

    eps = synthetic_episodes(8, 4, seed=0, max_set=3, max_events=3, prompt_len=(50, 300), completion_len=(10, 200),
                             vocab=args.vocab, constrained_share=0.0, policies=("p0",))
    return compile(eps, CompileConfig(micro_batch_tokens=args.budget)).micro_batches()[0]


def _model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                                        tie_word_embeddings=True))


class _NoKeep(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids, use_cache=False):
        return self.inner(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache)


def _padded(b):
    """Left-padded prompts + right-padded completions, as TRL's GRPOTrainer lays them out."""
    M = b.num_members
    off = b.member_offsets.tolist()
    comp_len = torch.zeros(M, dtype=torch.int64).index_add_(0, b.token_member, b.loss_mask.long()).tolist()
    P = max(off[m + 1] - off[m] - comp_len[m] for m in range(M))
    C = max(comp_len)
    ids = torch.zeros(M, P + C, dtype=torch.int64)
    attn = torch.zeros(M, P + C, dtype=torch.int64)
    for m in range(M):
        p = off[m + 1] - off[m] - comp_len[m]
        ids[m, P - p:P + comp_len[m]] = b.input_ids[off[m]:off[m + 1]]
        attn[m, P - p:P + comp_len[m]] = 1
    temp = b.member_temperature[:, None, None]
    return ids, attn, P, C, temp


def _selective_log_softmax(logits, index):
    """TRL's memory-saving form: gather, minus a logsumexp computed one row at a time."""
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return picked - lse


def step(variant: str, args) -> dict:
    from srpo_graph.srpo.logprobs import packed_logprobs

    torch.set_num_threads(1)
    b = _batch(args)
    model = _model(args.vocab)
    ids, attn, P, C, temp = _padded(b)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    comp_mask = attn[:, P:].bool()
    saved: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
        return t

    rss0, peak0 = _rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if variant in ("packed", "packed_full_logits", "padded_layout"):
            lp, _ = packed_logprobs([model if variant != "packed_full_logits" else _NoKeep(model)], b,
                                    layout="padded" if variant == "padded_layout" else "packed")
            total = lp.sum()
        elif variant == "padded_trl":
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                           logits_to_keep=C + 1).logits[:, :-1] / temp
            total = (_selective_log_softmax(logits, ids[:, P:]) * comp_mask).sum()
        else:
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits / temp
            lp = torch.log_softmax(logits[:, P - 1:-1], -1).gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)
            total = (lp * comp_mask).sum()
    total.backward()
    peak1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    completion = int(b.loss_mask.sum())
    vocab_rows = {"packed": completion, "padded_layout": completion, "packed_full_logits": b.num_tokens,
                  "padded_trl": b.num_members * C, "padded_full": b.num_members * (P + C)}[variant]
    return {"variant": variant, "peak_delta": peak1 - rss0, "new_high_water": peak1 > peak0,
            "saved_bytes": sum(saved.values()), "vocab_block_bytes": vocab_rows * args.vocab * 4,
            "tokens": b.num_tokens, "completion": completion, "members": b.num_members,
            "slots": b.num_members * (P + C), "value": float(total)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--budget", type=int, default=4096, help="micro-batch token budget")
    ap.add_argument("--variant", choices=VARIANTS)
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(step(args.variant, args)))
        return
    from _perfdoc import machine, write_result, write_section

    res = {}
    for v in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--variant", v, "--vocab", str(args.vocab),
                              "--budget", str(args.budget)], check=True, capture_output=True, text=True).stdout
        res[v] = json.loads(out.strip().splitlines()[-1])
    base = res["packed"]
    # the five variants compute the same sum of completion log-probs
    assert all(abs(r["value"] - base["value"]) < 1e-3 * abs(base["value"]) for r in res.values()), res

    def mib(x: int) -> str:
        return f"{x / 2**20:,.0f} MiB"

    rows = [f"| {LABELS[v]} | {mib(r['peak_delta'])}{'' if r['new_high_water'] else ' (<= setup peak)'} | "
            f"{r['peak_delta'] / base['peak_delta']:.2f}x | {mib(r['saved_bytes'])} | {mib(r['vocab_block_bytes'])} |"
            for v, r in res.items()]
    body = "\n".join(
        [
            "## Objective: memory of log-probs + backward (benchmarks/bench_memory.py)",
            "",
            f"One micro-batch ({args.budget}-token budget): {base['members']} members, {base['tokens']:,} tokens of "
            f"which "
            f"{base['completion']:,} completion tokens; the padded layout of the same members has "
            f"{res['padded_trl']['slots']:,} "
            f"slots. Random Llama, hidden 128, 2 layers, vocabulary {args.vocab:,}, float32, CPU ({machine()}). "
            "*Peak* is the real peak RSS of the step (forward + backward, one subprocess per variant) over the "
            "resident size just before it; *saved for backward* sums the unique storages autograd kept; "
            "*one [rows, V] block* counts rows x vocab x 4 bytes, the unit every vocabulary-sized tensor costs. "
            "All five compute the same sum of log-probs (checked). The packed step's log-softmax is one fused "
            "function (saves the [c, V] logits only; backward builds one [c, V] block). The packed rows also keep, per "
            "layer, a [1, 1, n, n] float32 attention mask that sdpa on CPU builds from the restarting position_ids "
            f"({base['tokens'] ** 2 * 4 / 2**20:,.0f} MiB at n = {base['tokens']:,}): it grows with the square of the "
            "micro-batch length; the padded layout (the default where no varlen attention kernel is used) has no "
            "mask at all (plain causal attention per row).",
            "",
            "| variant | peak memory of the step | vs packed | saved for backward | one [rows, V] block |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(body)
    write_section("memory", body)
    write_result("memory", {v: r["peak_delta"] for v, r in res.items()})


if __name__ == "__main__":
    main()
