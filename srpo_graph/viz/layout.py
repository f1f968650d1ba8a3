"""A layered layout of a workflow's routing graph, in pure Python (no Graphviz).

Stage: viz. Consumes a :class:`~srpo_graph.workflow.Workflow`, produces node positions:
layers by longest path from ``start`` after removing the back edges of cycles (found by a
depth-first search), then each layer ordered by the barycenter of its predecessors.
Knows nothing about drawing.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from srpo_graph.workflow import Workflow


@dataclass(frozen=True)
class Layout:
    """``pos[node] = (x, y)`` (y grows downwards by layer); ``back_edges`` close cycles."""

    pos: dict[str, tuple[float, float]]
    layers: list[list[str]]
    back_edges: frozenset[tuple[str, str]]


def _back_edges(g: nx.DiGraph, root: str) -> set[tuple[str, str]]:
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    roots = [root] + [n for n in g if n != root]
    for r in roots:
        if r in state:
            continue
        stack = [(r, iter(g.successors(r)))]
        state[r] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                back.add((node, nxt))
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(g.successors(nxt))))
    return back


def layout(workflow: Workflow) -> Layout:
    """Place every node of ``workflow.graph()`` on a layer.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> layout(w).layers
    [['start'], ['a'], ['t'], ['end']]
    """
    g = nx.DiGraph(workflow.graph())
    back = _back_edges(g, "start")
    dag = g.copy()
    dag.remove_edges_from(back)
    level: dict[str, int] = {}
    for n in nx.topological_sort(dag):
        preds = [level[p] for p in dag.predecessors(n)]
        level[n] = max(preds) + 1 if preds else 0
    others = [level[n] for n in level if n != "end"]
    if "end" in level and others:  # end is always the last layer
        level["end"] = max(others) + 1
    num_layers = max(level.values()) + 1
    order = {n: i for i, n in enumerate(g.nodes)}
    layers = [sorted((n for n in level if level[n] == k), key=order.__getitem__) for k in range(num_layers)]
    pos: dict[str, tuple[float, float]] = {}
    for k, layer in enumerate(layers):
        if k > 0:  # barycenter of the predecessors already placed
            def bary(n: str, k: int = k) -> float:
                xs = [pos[p][0] for p in dag.predecessors(n) if p in pos]
                return sum(xs) / len(xs) if xs else 0.0
            layer.sort(key=lambda n: (bary(n), order[n]))
        width = len(layer)
        for i, n in enumerate(layer):
            pos[n] = (i - (width - 1) / 2, float(k))
    return Layout(pos, layers, frozenset(back))
