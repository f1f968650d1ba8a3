"""Generate the small task files and the retrieval corpus, deterministically (no data from a hub).

Writes (relative to the repository root)::

    workflows/tasks/coord.jsonl, coord_eval.jsonl       {"id", "target"}             coord_*.wf
    workflows/tasks/routed.jsonl, routed_eval.jsonl     {"id", "target", "route"}    coord_routed.wf
    workflows/tasks/math.jsonl, math_eval.jsonl         {"id", "question", "answer"} math_*.wf
    workflows/tasks/search.jsonl, search_eval.jsonl     {"id", "question", "answer"} search.wf
    workflows/tasks/tinymath.jsonl, tinymath_eval.jsonl {"id", "question", "answer", "family"} tinymath_*.wf
    workflows/tasks/tinysearch.jsonl, tinysearch_eval.jsonl {"id", "question", "answer", "kind"} tinysearch.wf
    workflows/tasks/chat_math_qwen3.jsonl, chat_math_qwen3_eval.jsonl   tinymath's rows      chat_math_qwen3.wf
    srpo_graph/data/corpus.jsonl                        {"title", "text"}            std.retrieve

Everything is lower case and uses only characters the tiny model's vocabulary knows. The same
seed always gives byte-identical files (the test suite checks the committed files are current).

Usage: ``python scripts/make_data.py [--root DIR] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20260930

# --------------------------------------------------------------------------- coordination


def coord(rng: random.Random) -> tuple[list[dict], list[dict]]:
    train = [{"id": f"coord-{i:03d}", "target": i % 10} for i in range(40)]
    evals = [{"id": f"coord-eval-{t}", "target": t} for t in range(10)]
    return train, evals


def routed(rng: random.Random) -> tuple[list[dict], list[dict]]:
    combos = [(t, r) for t in range(10) for r in "abc"]
    train = [{"id": f"routed-{i:03d}", "target": t, "route": r} for i, (t, r) in enumerate(combos)]
    picks = rng.sample(combos, 12)
    evals = [{"id": f"routed-eval-{i:02d}", "target": t, "route": r} for i, (t, r) in enumerate(picks)]
    return train, evals


# --------------------------------------------------------------------------- math word problems

NAMES = ["tom", "ana", "li", "sam", "mia", "omar", "eva", "raj", "kim", "leo", "zoe", "ben"]
THINGS = ["apples", "books", "coins", "stamps", "pens", "cards", "shells", "marbles"]


def _math_problem(rng: random.Random) -> tuple[str, str]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    kind = rng.choice(["add", "sub", "mul", "div", "two_step"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        return f"{name} has {a} {thing} and gets {b} more. how many {thing} does {name} have now?", str(a + b)
    if kind == "sub":
        a = rng.randint(10, 90)
        b = rng.randint(1, a - 1)
        return f"{name} had {a} {thing} and gave away {b}. how many {thing} are left?", str(a - b)
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{name} buys {a} boxes with {b} {thing} in each box. how many {thing} is that in total?", str(a * b)
    if kind == "div":
        b = rng.randint(2, 9)
        a = b * rng.randint(2, 12)
        return f"{name} shares {a} {thing} equally among {b} friends. how many {thing} does each friend get?", str(
            a // b
        )
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    return (
        f"{name} buys {a} bags of {b} {thing}, then finds {c} more. how many {thing} does {name} have?",
        str(a * b + c),
    )


def math(rng: random.Random) -> tuple[list[dict], list[dict]]:
    seen: set[str] = set()
    rows = []
    while len(rows) < 250:
        q, a = _math_problem(rng)
        if q not in seen:
            seen.add(q)
            rows.append({"question": q, "answer": a})
    train = [{"id": f"math-{i:03d}", **r} for i, r in enumerate(rows[:200])]
    evals = [{"id": f"math-eval-{i:03d}", **r} for i, r in enumerate(rows[200:])]
    return train, evals


# --------------------------------------------------------------------------- corpus + search


def corpus_and_search(rng: random.Random) -> tuple[list[dict], list[dict], list[dict]]:
    from srpo_graph.models.sft_data import world

    docs, questions = world(rng, 70)
    rng.shuffle(docs)
    rng.shuffle(questions)
    rows = [{"question": q, "answer": a} for q, a in questions[:160]]
    train = [{"id": f"search-{i:03d}", **r} for i, r in enumerate(rows[:120])]
    evals = [{"id": f"search-eval-{i:03d}", **r} for i, r in enumerate(rows[120:])]
    return docs, train, evals


# --------------------------------------------------------------------------- the CPU math/search tasks

# For the locally pre-trained `tiny-reason` model (srpo_graph/models/recipes.py, data: sft_data.py): the problems it
# was never pre-trained on (`is_held_out`) are the eval split; the others are RL training tasks.


def tinymath(rng: random.Random) -> tuple[list[dict], list[dict]]:
    from srpo_graph.models.sft_data import is_held_out, math_problem

    seen: set[str] = set()
    train, evals = [], []
    while len(train) < 400 or len(evals) < 64:
        p = math_problem(rng)
        if p.question in seen:
            continue
        seen.add(p.question)
        rows = evals if is_held_out(p.question) else train
        if len(rows) < (64 if rows is evals else 400):
            rows.append({"question": p.question, "answer": str(p.answer), "family": p.family})
    train = [{"id": f"tinymath-{i:03d}", **r} for i, r in enumerate(train)]
    evals = [{"id": f"tinymath-eval-{i:03d}", **r} for i, r in enumerate(evals)]
    return train, evals


def tinysearch(rng: random.Random) -> tuple[list[dict], list[dict]]:
    from srpo_graph.models.sft_data import is_held_out, search_questions

    qs = search_questions()
    rng.shuffle(qs)
    rows = [{"question": q.question, "answer": q.answer, "kind": q.kind} for q in qs]
    train = [
        {"id": f"tinysearch-{i:03d}", **r} for i, r in enumerate(r for r in rows if not is_held_out(r["question"]))
    ]
    evals = [
        {"id": f"tinysearch-eval-{i:03d}", **r} for i, r in enumerate(r for r in rows if is_held_out(r["question"]))
    ]
    return train, evals


# --------------------------------------------------------------------------- main


def build() -> dict[str, list[dict]]:
    """Every file's rows, keyed by its path relative to the repository root."""
    rng = random.Random(SEED)
    out: dict[str, list[dict]] = {}
    for name, fn in (("coord", coord), ("routed", routed), ("math", math)):
        train, evals = fn(rng)
        out[f"workflows/tasks/{name}.jsonl"] = train
        out[f"workflows/tasks/{name}_eval.jsonl"] = evals
    docs, train, evals = corpus_and_search(rng)
    out["srpo_graph/data/corpus.jsonl"] = docs
    out["workflows/tasks/search.jsonl"] = train
    out["workflows/tasks/search_eval.jsonl"] = evals
    for name, fn in (("tinymath", tinymath), ("tinysearch", tinysearch)):
        train, evals = fn(random.Random(SEED + 1))
        out[f"workflows/tasks/{name}.jsonl"] = train
        out[f"workflows/tasks/{name}_eval.jsonl"] = evals
    # the same problems for the chat agent on the exact Qwen3 vocabulary (qwen3-realvocab-math, models/chat_recipe.py)
    out["workflows/tasks/chat_math_qwen3.jsonl"] = out["workflows/tasks/tinymath.jsonl"]
    out["workflows/tasks/chat_math_qwen3_eval.jsonl"] = out["workflows/tasks/tinymath_eval.jsonl"]
    return out


def render_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--check", action="store_true", help="only verify the files are up to date")
    args = ap.parse_args(argv)
    stale = []
    for rel, rows in build().items():
        path, text = Path(args.root) / rel, render_jsonl(rows)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {rel} ({len(rows)} rows)")
    if stale:
        print("out of date (run python scripts/make_data.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
