"""Chat turns in the trainer's prefix layout: tokens a step runs, padded vs prefix (issue 21).

A chat agent's turn k prompt starts with turn k-1's prompt and completion (runtime/chat.py), so
the ``prefix`` layout (srpo/prefix_tree.py, ``prefix_tree``) can run what an episode's turns -- and
the G samples of a task -- share once, nested: the task's prompt, then each sample's first turn,
then its second. This counts, on one rollout of ``workflows/chat_search_qwen3.wf`` (qwen3-test,
8 tasks x G = 4, seed 3): the tokens of the compiled batch (what ``padded``/``packed`` run: every
member's prompt + completion), the tokens the ``prefix`` layout runs (each segment of its prefix
tree once; also with no minimum saving per node), and the tokens of the trie of all sequences and
of all inputs (a member's tokens but its last, which scores nothing): the trie of the inputs is
the least any layout could run, every distinct prefix once.
Counts, not times: deterministic and fast (seconds). Writes a section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def trie_tokens(seqs: list[list[int]]) -> int:
    """Distinct prefixes over all sequences (nodes of their trie): the fewest tokens any sharing runs."""
    seen: set[tuple[int, ...]] = set()
    for s in seqs:
        for k in range(1, len(s) + 1):
            seen.add(tuple(s[:k]))
    return len(seen)


def measure(tasks: int = 8, samples: int = 4, seed: int = 3) -> dict:
    from srpo_graph.backends import load_backend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.srpo.prefix_tree import prefix_tree

    wf = load_workflow(ROOT / "workflows" / "chat_search_qwen3.wf")
    backend = load_backend("transformers", wf.policies[0].model)
    todo = load_tasks(ROOT / "workflows" / "tasks" / "chat_search_qwen3.jsonl", wf)[:tasks]
    episodes = run(wf, todo, {"m": backend}, samples=samples, seed=seed).episodes
    batch = compile(episodes, CompileConfig(micro_batch_tokens=0))
    members = torch.arange(batch.num_members)
    tree, full = prefix_tree(batch, members), prefix_tree(batch, members, min_saved=0)
    off = batch.member_offsets.tolist()
    seqs = [batch.input_ids[off[m]:off[m + 1]].tolist() for m in range(batch.num_members)]
    turns = sum(len(ep.outputs) for ep in episodes)
    return {"members": batch.num_members, "turns_per_episode": turns / len(episodes), "padded": sum(map(len, seqs)),
            "prefix": tree.num_tokens, "prefix_min0": full.num_tokens, "trie": trie_tokens(seqs),
            "trie_inputs": trie_tokens([s[:-1] for s in seqs]), "completion": int(batch.loss_mask.sum()),
            "segments": len(tree.start), "nodes": sum(1 for k in tree.children if k)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = measure()
    print(r)
    if args.no_doc:
        return
    from _perfdoc import machine, write_result, write_section

    from srpo_graph.srpo.prefix_tree import MIN_SHARED_TOKENS

    write_result("chat_prefix", r)
    body = "\n".join(
        [
            "## Chat turns in the prefix layout",
            "",
            f"`benchmarks/bench_chat_prefix.py` ({machine()}): one rollout of `workflows/chat_search_qwen3.wf` "
            f"(qwen3-test, 8 tasks x G = 4, {r['members']} turns, {r['turns_per_episode']:.1f} per episode). Tokens "
            "the update's forward runs: `padded`/`packed` run every turn's prompt + completion; `prefix` runs each "
            "segment of the prefix tree of the members' inputs once (a task's prompt, then each sample's first turn, "
            "then its second ...: a later turn's prompt extends the earlier turn's prompt and completion, token for "
            "token, and an earlier turn's completion is scored from the rows its later turn runs); the trie of the "
            "inputs (each member's tokens but the last, which scores nothing) is the least any layout could run.",
            "",
            "| layout | tokens run | vs padded |",
            "|---|---|---|",
            f"| padded / packed | {r['padded']:,} | 1.00x |",
            f"| prefix ({r['segments']} segments, {r['nodes']} shared nodes; a node where it saves >= "
            f"{MIN_SHARED_TOKENS} tokens) | {r['prefix']:,} | {r['prefix'] / r['padded']:.2f}x |",
            f"| prefix, a node at every branch (no minimum) | {r['prefix_min0']:,} | "
            f"{r['prefix_min0'] / r['padded']:.2f}x |",
            f"| trie of the sequences (every distinct prefix once) | {r['trie']:,} | {r['trie'] / r['padded']:.2f}x |",
            f"| trie of the inputs (the least any layout runs) | {r['trie_inputs']:,} | "
            f"{r['trie_inputs'] / r['padded']:.2f}x |",
            "",
            "Before the tree (one shared prompt prefix per group of members): 5,783 tokens, 0.47x.",
            "",
            f"Completion tokens (scored): {r['completion']:,}.",
        ]
    )
    write_section("chat_prefix", body)


if __name__ == "__main__":
    main()
