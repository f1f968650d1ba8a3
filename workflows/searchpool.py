"""The tool of ``workflows/tinysearch_k5.wf``: one retrieval for five queries written in parallel.

Imported by the ``.wf`` file (``import searchpool``; the workflow's folder is on the import path).
Each passage of the corpus is scored by its best BM25 score under any of the queries, and the top
``k`` are returned as :func:`srpo_graph.std.retrieve` returns them (one ``title: text`` line each),
so the reader sees what ``tiny-search`` was pre-trained to read: the question and two passages.
The five queries are one action: which passages come back depends on all of them together.
"""

from __future__ import annotations

from srpo_graph.std import DEFAULT_CORPUS, _bm25_index, _norm


def pooled(q1: str, q2: str, q3: str, q4: str, q5: str, k: int = 2) -> str:
    """The top ``k`` passages over the five queries (empty or missing queries are skipped).

    >>> pooled("", "", "", "", "")
    ''
    >>> pooled("capital of morte", "", "", "", "", k=1) == pooled("", "", "capital of morte", "", "", k=1)
    True
    """
    queries = [str(q) for q in (q1, q2, q3, q4, q5) if q is not None and str(q).strip()]
    if not queries:
        return ""
    index, docs = _bm25_index(str(DEFAULT_CORPUS))
    best = [float("-inf")] * len(docs)
    for q in queries:
        for i, s in enumerate(index.get_scores(_norm(q).split())):
            best[i] = max(best[i], float(s))
    top = sorted(range(len(docs)), key=lambda i: -best[i])[:k]
    return "\n".join(f"{docs[i]['title']}: {docs[i]['text']}" for i in top)
