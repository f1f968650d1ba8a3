"""Peak memory and time of one update step on Qwen-shaped models at real vocabulary sizes (P8).

Run: ``python benchmarks/bench_real_models.py [--tokens 256]``. Each configuration runs once, in
its own subprocess (one thread): a Qwen2 model built here (srpo_graph/models/architectures.py:
the ``mid`` shape, Qwen2.5-0.5B's width 896, 14 heads, 2 kv heads, MLP 4,864, 2 layers, tied
embeddings; ``test`` is hidden 64) with the given number of vocabulary rows, random weights, and
one micro-batch of synthetic traces (8 members, ``--tokens`` prompt tokens and ``--tokens``
completion tokens in all) goes through one update step: ``packed_logprobs`` (padded layout) +
``srpo_loss`` + ``backward`` + one AdamW step. Variants:

* ``whole``: ``head_chunk=0``, the log-prob path before issue 21: the whole [completion tokens, V]
  logits block, held for backward;
* ``chunked``: the default since issue 21 (srpo/lm_head.py, Note [Chunked head]);
* ``+ bf16``: the step under ``optim.autocast = "bfloat16"`` (weights stay float32);
* ``+ ckpt``: ``optim.gradient_checkpointing = true``;
* ``bf16 weights``: the model in bfloat16 (``rollout.dtype``), for the per-parameter costs;
* ``exact tokenizer``: the models of srpo_graph/models/released.py (``qwen2.5-0.5b-2layer``: the
  released Qwen2.5-0.5B-Instruct config.json with 2 layers; ``qwen2.5-realvocab-test``: its
  vocabulary at the test width) on the ids of chat turns in Qwen2.5's exact tokenizer (needs the
  ``tokenizers`` extra).

Measured per run: *peak* = peak RSS during forward + backward minus the RSS just before (the
loaded model and optimizer), so it includes the gradients (4 bytes per parameter in float32);
*Adam* = the RSS growth of the first optimizer step (its two states); the wall time of
forward + backward. From these the per-token costs (the slope between ``--tokens`` and twice as
many) and per-parameter costs behind docs/gpu.md's memory table. Writes its section of
docs/performance.md and benchmarks/results/real_models.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(spec: dict) -> dict:
    """One configuration, in this process: the measurements as a dict."""
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.compiler.synthetic import synthetic_episodes
    from srpo_graph.models.architectures import build_config
    from srpo_graph.srpo.logprobs import packed_logprobs
    from srpo_graph.srpo.loss import loss_denominator, srpo_loss
    from srpo_graph.srpo.options import LossConfig
    from srpo_graph.train.policies.precision import enable_gradient_checkpointing, update_forward

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if spec.get("model"):  # a model on a released tokenizer (models/released.py), as built
        from srpo_graph.models import resolve_model

        model = AutoModelForCausalLM.from_pretrained(resolve_model(spec["model"]), dtype=dtype).eval()
    else:
        cfg = build_config("qwen2.5", spec["size"], spec["vocab"])
        cfg.vocab_size = spec["vocab"]
        if spec.get("layers", 2) != 2:
            cfg = type(cfg)(**{**cfg.to_dict(), "num_hidden_layers": spec["layers"], "layer_types": None})
        model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    if spec.get("ckpt"):
        enable_gradient_checkpointing(model)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    n = spec["tokens"] // 8  # 8 members of n prompt + n completion tokens
    eps = synthetic_episodes(8, 1, seed=0, max_set=1, max_events=1, prompt_len=(n, n), completion_len=(n, n),
                             vocab=min(spec["vocab"], 1500), constrained_share=0.0, policies=("p",))
    b = compile(eps, CompileConfig(micro_batch_tokens=10**7))
    if spec.get("model"):  # the ids of real chat turns, in the exact tokenizer (the cost does not depend on them)
        from srpo_graph.models.tiny import load_tokenizer

        tok = load_tokenizer(resolve_model(spec["model"]))
        text = "".join(
            tok.apply_chat_template([{"role": "user", "content": f"Question {i}: what is {i} + {i}? 中文 🙂"},
                                     {"role": "assistant", "content": f"<think>\nadd\n</think>\n\n{2 * i}"}],
                                    tokenize=False) for i in range(200))
        ids = tok(text, add_special_tokens=False)["input_ids"][: b.num_tokens]
        b = b.with_(input_ids=torch.tensor(ids, dtype=b.input_ids.dtype))
    loss_cfg = LossConfig()
    b = b.with_(old_logprobs=b.sampler_logprobs)
    import gc

    gc.collect()
    rss0, high0 = _rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    with update_forward([model], "bfloat16" if spec.get("bf16") else "off"):
        lp, ent = packed_logprobs([model], b, layout="padded", head_chunk=0 if spec["head"] == "whole" else None)
    loss, _ = srpo_loss(lp, b, loss_cfg, denominator=loss_denominator(b, loss_cfg), entropy=ent)
    loss.backward()
    t1 = time.perf_counter()
    high1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    del lp, ent, loss
    gc.collect()
    rss1 = _rss()
    opt.step()
    rss2 = _rss()
    adam_exact = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                     if torch.is_tensor(t) and t.dim() > 0)
    return {
        **spec,
        "adam_exact": adam_exact,
        "params": params,
        "completion_tokens": int(b.loss_mask.sum()),
        "stream_tokens": b.num_tokens,
        "peak": high1 - rss0,
        "new_high_water": high1 > high0,
        "grads": grads,
        "adam": rss2 - rss1,
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "seconds": t1 - t0,
    }


def configs(tokens: int) -> list[dict]:
    out = []
    for vocab in (32_000, 128_256, 151_936):  # the vocabulary sweep at the mid shape (151,936 = the scale size)
        for head in ("whole", "chunked"):
            out.append(
                {
                    "name": f"mid shape, V={vocab:,}, {head}",
                    "size": "mid",
                    "vocab": vocab,
                    "head": head,
                    "tokens": tokens,
                }
            )
    for size, vocab in (("test", 1_600), ("mid", 1_600)):  # the test and mid sizes at their tokenizer's vocabulary
        for head in ("whole", "chunked"):
            out.append(
                {"name": f"{size}, V={vocab:,}, {head}", "size": size, "vocab": vocab, "head": head, "tokens": tokens}
            )
    for model, label in (("qwen2.5-0.5b-2layer", "Qwen2.5-0.5B config, 2 layers, exact tokenizer, V=151,936"),
                         ("qwen2.5-realvocab-test", "test width, exact tokenizer, V=151,665")):
        for head in ("whole", "chunked"):  # models/released.py: the released config / vocabulary, chat ids
            out.append({"name": f"{label}, {head}", "size": "mid", "vocab": 151_936, "head": head, "tokens": tokens,
                        "model": model})
    for extra in ({"bf16": True}, {"ckpt": True}):  # at the scale size
        tag = " + bf16" if extra.get("bf16") else " + ckpt"
        out.append(
            {
                "name": f"mid shape, V=151,936, chunked{tag}",
                "size": "mid",
                "vocab": 151_936,
                "head": "chunked",
                "tokens": tokens,
                **extra,
            }
        )
    for extra in ({}, {"bf16": True}, {"ckpt": True}):  # per-token slopes (twice the tokens), mid size
        tag = " + bf16" if extra.get("bf16") else " + ckpt" if extra.get("ckpt") else ""
        for t in (tokens, 2 * tokens):
            if not extra and t == tokens:
                continue  # measured above
            out.append(
                {
                    "name": f"mid, V=1,600, chunked{tag}, {t} tokens",
                    "size": "mid",
                    "vocab": 1_600,
                    "head": "chunked",
                    "tokens": t,
                    **extra,
                }
            )
    for tag, extra in (("", {}), (" + bf16", {"bf16": True}), (" + ckpt", {"ckpt": True})):  # per-layer costs
        out.append(
            {
                "name": f"mid 4 layers, V=1,600, chunked{tag}, {2 * tokens} tokens",
                "size": "mid",
                "vocab": 1_600,
                "head": "chunked",
                "tokens": 2 * tokens,
                "layers": 4,
                **extra,
            }
        )
    out.append(
        {
            "name": "mid, bf16 weights",
            "size": "mid",
            "vocab": 1_600,
            "head": "chunked",
            "tokens": tokens,
            "dtype": "bfloat16",
        }
    )
    return out


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f} MiB"


def report(res: list[dict], tokens: int) -> str:
    by = {r["name"]: r for r in res}
    lines = [
        "## P8. One update step at real vocabulary sizes: the chunked lm_head, bf16, checkpointing",
        "",
        f"`python benchmarks/bench_real_models.py --tokens {tokens}` ({res[0]['machine']}): one micro-batch of "
        f"{tokens} prompt + {tokens} completion tokens (8 members) through `packed_logprobs` (padded layout) + "
        "`srpo_loss` + backward, on Qwen2 models built here (`srpo_graph/models/`: the *mid* shape is Qwen2.5-0.5B's "
        "width 896 / 14 heads / MLP 4,864 with 2 layers, tied embeddings; *scale* = mid at V = 151,936). *Peak* = peak "
        "RSS of forward + backward above the loaded model (it includes the float32 gradients, 4 bytes per "
        "parameter); *whole* = the log-prob path before issue 21 (`head_chunk=0`: the whole [completion tokens, V] "
        "block kept for backward), *chunked* = now (srpo/lm_head.py). One run each, one thread: times are indicative.",
        "",
        "| configuration | parameters | peak above the model | of which gradients | vs whole | forward + backward |",
        "|---|---|---|---|---|---|",
    ]
    for r in res:
        if r["tokens"] != tokens or r.get("dtype"):
            continue
        twin = by.get(
            r["name"].replace("chunked", "whole").replace(" + ckpt", "").replace(" + bf16", "")
            if r["head"] == "chunked"
            else r["name"]
        )
        ratio = f"{r['peak'] / twin['peak']:.2f}x" if twin and twin is not r else "1.00x"
        hw = "" if r["new_high_water"] else " (<= setup peak)"
        lines.append(
            f"| {r['name']} | {r['params'] / 1e6:.1f}M | {_mib(r['peak'])}{hw} | {_mib(r['grads'])} | {ratio} | "
            f"{r['seconds']:.1f} s |"
        )
    return "\n".join(lines)


def costs(res: list[dict], tokens: int) -> dict:
    """Per-token and per-parameter costs: the slopes between ``tokens`` and twice as many."""
    by = {r["name"]: r for r in res}

    def slope(lo: dict, hi: dict) -> float:
        return (hi["peak"] - lo["peak"]) / (hi["stream_tokens"] - lo["stream_tokens"])

    out: dict = {}
    for tag in ("", " + bf16", " + ckpt"):  # two more layers at the same tokens: what one layer holds per token
        two, four = (
            by[f"mid, V=1,600, chunked{tag}, {2 * tokens} tokens"],
            by[f"mid 4 layers, V=1,600, chunked{tag}, {2 * tokens} tokens"],
        )
        out[f"activations, bytes per token per layer (mid shape{tag or ', float32'})"] = (
            four["peak"] - four["grads"] - two["peak"] + two["grads"]
        ) / (2 * two["stream_tokens"])
    for tag in ("", " + bf16", " + ckpt"):
        lo = by[f"mid, V=1,600, chunked{tag}, {tokens} tokens"] if tag else by["mid, V=1,600, chunked"]
        out[f"peak bytes per token, 2 layers (mid shape{tag or ', float32'})"] = slope(
            lo, by[f"mid, V=1,600, chunked{tag}, {2 * tokens} tokens"]
        )
    whole, chunked = by["mid shape, V=151,936, whole"], by["mid shape, V=151,936, chunked"]
    out["whole minus chunked at V=151,936, bytes per completion token"] = (whole["peak"] - chunked["peak"]) / whole[
        "completion_tokens"
    ]
    for label, r in (("bfloat16", by["mid, bf16 weights"]), ("float32", by["mid, V=1,600, chunked"])):
        out[f"{label} weights: bytes per parameter (weights, gradients, Adam states)"] = [
            r["weights"] / r["params"],
            r["grads"] / r["params"],
            r.get("adam_exact", r["adam"]) / r["params"],
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=256, help="prompt tokens (and as many completion tokens) per step")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="run only configurations whose name contains this")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _perfdoc import machine, write_result, write_section

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = []
    for spec in configs(args.tokens):
        if args.only not in spec["name"]:
            continue
        out = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True, env=env, timeout=900
        )
        if out.returncode:
            raise SystemExit(f"{spec['name']} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["machine"] = machine()
        print(
            f"{r['name']}: peak {_mib(r['peak'])}, grads {_mib(r['grads'])}, adam {_mib(r['adam'])}, "
            f"{r['seconds']:.1f} s",
            flush=True,
        )
        res.append(r)
    if args.only:  # merged into the last full run's results (same names replaced)
        from _perfdoc import read_result

        old = (read_result("real_models") or {}).get("runs", [])
        names = {r["name"] for r in res}
        res = [r for r in old if r["name"] not in names] + res
        order = [c["name"] for c in configs(args.tokens)]
        res.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    c = costs(res, args.tokens)
    body = (
        report(res, args.tokens)
        + "\n\nDerived (docs/gpu.md's memory table uses these):\n\n"
        + "\n".join(
            f"- {k}: " + (", ".join(f"{x:.2f}" for x in v) if isinstance(v, list) else f"{v / 1024:,.1f} KiB")
            for k, v in c.items()
        )
    )
    write_section("real_models", body)
    write_result("real_models", {"runs": res, "costs": c})


if __name__ == "__main__":
    main()
