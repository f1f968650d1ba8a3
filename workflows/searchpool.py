"""The tool of ``workflows/tinysearch_k5.wf``: one retrieval for five queries written in parallel.

Imported by the ``.wf`` file (``import searchpool``; the workflow's folder is on the import path).
Each passage of the corpus is scored by the sum of its BM25 scores under the queries (the passages
the five queries agree on), and the top ``k`` are returned as :func:`srpo_graph.std.retrieve` returns them (one ``title: text`` line each),
so the reader sees what ``tiny-search`` was pre-trained to read: the question and two passages.
The five queries are one action: which passages come back depends on all of them together.

Why the sum, not the best score under any query (``pool="max"``, the first version): five queries
sampled at temperature 1 usually include an off-target one, and BM25 scores are not comparable
across queries (a longer query scores higher), so under ``max`` one stray query decides the
passages. Measured on the pre-trained ``tiny-search`` (64 held-out questions x 4 samples, one
``srpo-graph eval``): Avg@4 0.105 with ``max`` (192 of 256 episodes ran out of rounds, the reader
asking for more) against 0.315 with the sum (91), inside the 20-60% a start must leave to learn.
"""

from __future__ import annotations

from srpo_graph.std import DEFAULT_CORPUS, _bm25_index, _norm


def pooled(q1: str, q2: str, q3: str, q4: str, q5: str, k: int = 2, pool: str = "sum") -> str:
    """The top ``k`` passages over the five queries (empty or missing queries are skipped), each passage
    scored by the sum (``pool="sum"``) or the best (``pool="max"``) of its BM25 scores under them.

    >>> pooled("", "", "", "", "")
    ''
    >>> pooled("capital of morte", "", "", "", "", k=1) == pooled("", "", "capital of morte", "", "", k=1)
    True
    """
    if pool not in ("sum", "max"):
        raise ValueError(f"pooled: pool must be 'sum' or 'max', not {pool!r}")
    queries = [str(q) for q in (q1, q2, q3, q4, q5) if q is not None and str(q).strip()]
    if not queries:
        return ""
    index, docs = _bm25_index(str(DEFAULT_CORPUS))
    best = [float("-inf") if pool == "max" else 0.0] * len(docs)
    for q in queries:
        for i, s in enumerate(index.get_scores(_norm(q).split())):
            best[i] = max(best[i], float(s)) if pool == "max" else best[i] + float(s)
    top = sorted(range(len(docs)), key=lambda i: -best[i])[:k]
    return "\n".join(f"{docs[i]['title']}: {docs[i]['text']}" for i in top)
