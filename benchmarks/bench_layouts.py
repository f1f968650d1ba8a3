"""P5: the update's forward+backward in each micro-batch layout vs a raw forward+backward.

One step's SetBatch of the TRL comparison workload (``benchmarks/workloads/single16.wf``: one
agent, 16-token completions, 16 tasks x 8 samples, sampled by the tiny model itself) is run
through the objective's whole micro-batch work -- ``packed_logprobs`` + ``srpo_loss`` +
``backward`` -- in each layout of ``srpo_graph.srpo.logprobs`` (Note [Layouts]):

* ``packed``: one row per policy and micro-batch (sdpa on CPU builds a dense [n, n] mask);
  at the default ``micro_batch_tokens`` (8192: one micro-batch) and at 256;
* ``padded``: length buckets (the default bucket overhead, a bucket per distinct length, and
  one bucket), at the default micro-batch budget;

and a **raw** forward+backward of the same sequences: one right-padded [B, L] batch, the model's
full logits, ``log_softmax`` + gather on the completion tokens, ``sum().backward()`` -- the least
work any trainer does for these tokens. P5 = raw time / layout time (= update tokens/s over raw
tokens/s; >= 0.85x is the target). Variants alternate within each round; per variant the best
round (CPU time, ``process_time``: the cores are shared), and the min-max over rounds of the
per-round ratio. One thread. Writes its section of
docs/performance.md.

A third table is the study's (docs/results.md): one step of each CPU study workflow (8 tasks x G = 8,
sampled by its pre-trained model, ``tiny-reason`` / ``tiny-search``), its rollout with and without the
shared prefill (``TransformersBackend(share_prefill=...)``) and its update forward+backward padded vs
prefix (what members' inputs share runs once, nested, through the KV cache).

A second table runs synthetic traces of very different lengths through the padded layout at several
bucket overheads (the default ``BUCKET_OVERHEAD_TOKENS`` should be the fastest), one bucket, and
packed rows.

Usage: ``python benchmarks/bench_layouts.py [--rounds 9] [--workflows tinymath_pipeline ...] [--note TEXT] [--no-doc]``
(``--workflows``: the study workflows of the third table, default all four; a recipe model not yet
built is built first, which takes minutes to an hour on a loaded CPU.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "single16.wf"


def step_batch(model, tokenizer, tasks_per_step: int = 16, samples: int = 8, seed: int = 1):
    """One step's SetBatch of the single16 workload, sampled by ``model``; old = sampler log-probs."""
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(WORKLOAD)
    tasks = load_tasks(ROOT / "benchmarks" / "workloads" / "digits.jsonl", wf)[:tasks_per_step]
    res = run(wf, tasks, {"tiny": TransformersBackend(model, tokenizer)}, samples=samples, seed=seed)
    return compile(res.episodes, CompileConfig())


def raw_step(model, batch):
    """A callable: one right-padded [B, L] forward+backward of the batch's members (full logits)."""
    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1])
    L = int(lengths.max())
    col = torch.arange(L)
    valid = col.unsqueeze(0) < lengths.unsqueeze(1)
    grid = (batch.member_offsets[:-1].unsqueeze(1) + col).masked_fill(~valid, 0)
    ids = batch.input_ids[grid].masked_fill(~valid, 0)
    target = (batch.loss_mask[grid] & valid)[:, 1:]  # [B, L-1]: completion tokens, scored at t-1

    def run() -> None:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
        (lp * target).sum().backward()
        model.zero_grad(set_to_none=True)

    return run


def update_step(model, batch, layout: str, overhead: int | None):
    """A callable: the objective's micro-batch loop (log-probs, SRPO loss, backward) in ``layout``."""
    from srpo_graph.srpo.forwards import BUCKET_OVERHEAD_TOKENS
    from srpo_graph.srpo.logprobs import packed_logprobs
    from srpo_graph.srpo.loss import loss_denominator, srpo_loss
    from srpo_graph.srpo.options import LossConfig

    cfg = LossConfig()
    denom = loss_denominator(batch, cfg)
    micros = batch.micro_batches()
    kw = {"layout": layout, "bucket_overhead": BUCKET_OVERHEAD_TOKENS if overhead is None else overhead}

    def run() -> None:
        for micro in micros:
            lp, ent = packed_logprobs([model], micro, **kw)
            loss, _ = srpo_loss(lp, micro, cfg, denominator=denom, entropy=ent)
            loss.backward()
        model.zero_grad(set_to_none=True)

    return run


def _alternated(fns: dict, rounds: int) -> dict[str, list[float]]:
    """CPU time of each callable per round, after one warm-up call each; the callables alternate within a round."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for key, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[key].append(time.process_time() - t0)
    return times


def varied_lengths(model, rounds: int) -> list[str]:
    """The bucket overhead on members of very different lengths (synthetic traces): markdown lines."""
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.compiler.synthetic import synthetic_episodes
    from srpo_graph.srpo.forwards import BUCKET_OVERHEAD_TOKENS

    eps = synthetic_episodes(8, 8, seed=0, max_set=3, max_events=2, prompt_len=(10, 120), completion_len=(4, 80),
                             vocab=model.config.vocab_size, constrained_share=0.0, policies=("tiny",))
    batch = compile(eps, CompileConfig())
    lengths = (batch.member_offsets[1:] - batch.member_offsets[:-1])
    variants = {f"padded, overhead {o}" + (" (default)" if o == BUCKET_OVERHEAD_TOKENS else ""):
                update_step(model, batch, "padded", o) for o in (0, 32, BUCKET_OVERHEAD_TOKENS, 512)}
    variants["padded, one bucket"] = update_step(model, batch, "padded", 10**9)
    variants["packed, micro_batch_tokens 512"] = update_step(model, batch.with_micro_batch_tokens(512), "packed", None)
    times = _alternated(variants, max(1, rounds // 3))
    slow = f"packed, micro_batch_tokens {batch.micro_batch_tokens} (one round)"
    t0 = time.process_time()
    update_step(model, batch, "packed", None)()
    times[slow] = [time.process_time() - t0]
    best = {k: min(v) for k, v in times.items()}
    ref = min(best.values())
    lines = ["", f"Varied lengths (synthetic traces, {batch.num_members} members of {int(lengths.min())}-"
             f"{int(lengths.max())} tokens, {batch.num_tokens:,} tokens; same model and loop): the bucket overhead "
             "(`BUCKET_OVERHEAD_TOKENS`, the cost of one more forward in token slots) against a bucket per length, "
             "one bucket, and packed rows.", "", "| layout | fwd+bwd time | vs fastest |", "|---|---|---|"]
    lines += [f"| {k} | {1000 * v:.1f} ms | {v / ref:.2f}x |" for k, v in best.items()]
    return lines


STUDY_WORKFLOWS = ("tinymath_pipeline", "tinymath_mixed", "tinymath_select", "tinysearch")


def study_workloads(rounds: int, workflows: tuple[str, ...] = STUDY_WORKFLOWS) -> list[str]:
    """One step of each CPU study workflow: rollout with / without the shared prefill, update
    forward+backward padded vs prefix. Markdown lines."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import load_workflow
    from srpo_graph.models.recipes import ensure_recipe_model
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.srpo.prefix_tree import prefix_tree

    lines = [
        "",
        "The study's workflows (docs/results.md): one step of 8 tasks x G = 8 samples of each, sampled at "
        "temperature 1 by its pre-trained model. *Rollout*: the executor's whole step, each distinct prompt "
        "prefilled once (the default) vs one prefill row per request. *Update*: the objective's micro-batch "
        "loop (as above) in the `padded` and `prefix` layouts; *prompt share* is the part of the step's "
        "tokens in prompts, *shared* the part the prefix layout does not run (its prefix tree of each policy's "
        "members runs what their inputs share once, and no member's last token). Best CPU time of "
        f"{max(1, rounds // 3)} alternated rounds.",
        "",
        "| workflow | tokens | prompt share | shared | rollout: shared / per-row prefill | update: prefix / padded | "
        "update: prefix, padded |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in workflows:
        wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
        path = ensure_recipe_model(wf.policies[0].model)
        model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        tok = AutoTokenizer.from_pretrained(str(path))
        tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{name.split('_')[0]}.jsonl", wf)[:8]
        backends = {
            share: {p.name: TransformersBackend(model, tok, share_prefill=share) for p in wf.policies}
            for share in (True, False)
        }
        batch = compile(run(wf, tasks, backends[True], samples=8, seed=3).episodes, CompileConfig())
        run_tokens = sum(
            prefix_tree(batch, (batch.member_policy == p).nonzero().squeeze(1)).num_tokens
            for p in range(len(batch.policies))
        )
        lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
        prompt = int(lengths.sum()) - int(batch.loss_mask.sum())
        saved = batch.num_tokens - run_tokens
        fns = {
            "rollout_shared": lambda b=backends[True]: run(wf, tasks, b, samples=8, seed=3),
            "rollout_rows": lambda b=backends[False]: run(wf, tasks, b, samples=8, seed=3),
            "padded": update_step(model, batch, "padded", None),
            "prefix": update_step(model, batch, "prefix", None),
        }
        best = {k: min(v) for k, v in _alternated(fns, max(1, rounds // 3)).items()}
        print(name, {k: round(v, 3) for k, v in best.items()})
        lines.append(
            f"| {name} | {batch.num_tokens:,} | {prompt / batch.num_tokens:.0%} | {saved / batch.num_tokens:.0%} | "
            f"{best['rollout_shared'] / best['rollout_rows']:.2f}x ({1000 * best['rollout_shared']:.0f} vs "
            f"{1000 * best['rollout_rows']:.0f} ms) | **{best['prefix'] / best['padded']:.2f}x** | "
            f"{1000 * best['prefix']:.0f}, {1000 * best['padded']:.0f} ms |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument(
        "--workflows",
        nargs="+",
        choices=STUDY_WORKFLOWS,
        default=list(STUDY_WORKFLOWS),
        help="the study workflows of the third table (default: all)",
    )
    ap.add_argument("--note", default="", help="a line for the doc section (e.g. how loaded the machine was)")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
    from srpo_graph.srpo.forwards import BUCKET_OVERHEAD_TOKENS
    from srpo_graph.srpo.logprobs import choose_layout

    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    batch = step_batch(model, load_tokenizer(path))
    lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
    auto = choose_layout(model)
    variants = {
        "raw": ("raw padded [B, L] forward+backward, full logits (baseline)", raw_step(model, batch)),
        "padded": (
            f"padded, length buckets (overhead {BUCKET_OVERHEAD_TOKENS})",
            update_step(model, batch, "padded", None),
        ),
        "padded_each": ("padded, a bucket per distinct length", update_step(model, batch, "padded", 0)),
        "padded_one": ("padded, one bucket", update_step(model, batch, "padded", 10**9)),
        "prefix": (
            f"prefix: the prefix tree of the inputs, each segment once (overhead {BUCKET_OVERHEAD_TOKENS})",
            update_step(model, batch, "prefix", None),
        ),
        "packed": (f"packed, micro_batch_tokens {batch.micro_batch_tokens}", update_step(model, batch, "packed", None)),
        "packed_256": (
            "packed, micro_batch_tokens 256",
            update_step(model, batch.with_micro_batch_tokens(256), "packed", None),
        ),
    }
    times = _alternated({k: fn for k, (_, fn) in variants.items()}, args.rounds)
    best = {k: min(v) for k, v in times.items()}
    for k, v in best.items():
        print(f"{k:12s} {1000 * v:8.1f} ms")
    lines = [
        "## P5: update forward+backward by layout vs raw (benchmarks/bench_layouts.py)",
        "",
        f"One step's SetBatch of `benchmarks/workloads/single16.wf` (16 tasks x 8 samples, 16-token completions, "
        f"sampled by the tiny model): {batch.num_sets} events, {batch.num_tokens:,} tokens, member lengths "
        f"{int(lengths.min())}-{int(lengths.max())}. Each layout runs the objective's whole micro-batch loop "
        "(`packed_logprobs` + `srpo_loss` with diagnostics + `backward`); *raw* is one right-padded [B, L] "
        "forward+backward "
        "with full logits and a plain log-softmax. Best CPU time of "
        f"{args.rounds} alternated rounds; ratio min-max over the rounds; {machine()}; the 2 cores were shared with "
        f"other engineers' jobs. `auto` picks **{auto}** here (attention: `{model.config._attn_implementation}`).",
        "",
        "| layout | fwd+bwd time | update tokens/s | raw / layout (P5) | min-max |",
        "|---|---|---|---|---|",
    ]
    for key, (label, _) in variants.items():
        per_round = [r / t for r, t in zip(times["raw"], times[key])]
        lines.append(
            f"| {label} | {1000 * best[key]:.1f} ms | {batch.num_tokens / best[key]:,.0f} | "
            f"{best['raw'] / best[key]:.2f}x | {min(per_round):.2f}-{max(per_round):.2f}x |"
        )
    lines += [
        "",
        f"P5 (default layout `{auto}` vs raw): **{best['raw'] / best[auto]:.2f}x** (target >= 0.85x); "
        f"packed at the default budget is {best['packed'] / best[auto]:.1f}x the default layout's time.",
    ]
    lines += varied_lengths(model, args.rounds)
    lines += study_workloads(args.rounds, tuple(args.workflows))
    if set(args.workflows) != set(STUDY_WORKFLOWS):
        lines += ["", f"Not run this time: {', '.join(w for w in STUDY_WORKFLOWS if w not in args.workflows)}."]
    if args.note:
        lines += ["", args.note]
    print("\n".join(lines))
    p5 = [r / t for r, t in zip(times["raw"], times[auto])]
    if not args.no_doc:
        write_section("layouts", "\n".join(lines))
        write_result(
            "layouts",
            {
                "auto": auto,
                "p5": best["raw"] / best[auto],
                "p5_min": min(p5),
                "p5_max": max(p5),
                "packed_over_auto": best["packed"] / best[auto],
                "best_s": best,
            },
        )
    return best


if __name__ == "__main__":
    main()
