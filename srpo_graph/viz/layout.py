"""A layered (Sugiyama) layout of a workflow's routing graph, from a library.

Stage: viz. Consumes a :class:`~srpo_graph.workflow.Workflow`, produces node positions in layout
units (``x``: columns, neighbours at least 1 apart; ``y``: the layer, 0 = ``start``). Knows
nothing about drawing. Two engines, one table (:data:`ENGINES`):

* ``grandalf`` (pure Python, the default when Graphviz is absent): grandalf's
  ``SugiyamaLayout`` -- layering, dummy vertices for long edges, crossing reduction by
  barycenters, horizontal placement after Brandes-Köpf;
* ``dot`` (Graphviz's ``dot`` program, used by ``auto`` when it is on ``PATH``): ``dot -Tplain``.

Cycles: the back edges are found once here (the arcs of a cycle that go back towards ``start``,
by breadth-first distance -- a judge's ``again`` route back to the debaters) and
handed to the engine as the edges to invert, so every engine layers the same acyclic graph: a
loop's target stays above the transition that loops back to it, and the renderer draws the
back edge curving up. ``end`` is always alone on the last layer.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from srpo_graph.workflow import Workflow

DOT_TIMEOUT_S = 20.0  # a Graphviz that hangs falls back to grandalf (every call has a deadline)


@dataclass(frozen=True)
class Layout:
    """``pos[node] = (x, y)`` (x in columns, y grows downwards by layer); ``back_edges`` close cycles."""

    pos: dict[str, tuple[float, float]]
    layers: list[list[str]]
    back_edges: frozenset[tuple[str, str]]
    engine: str = "grandalf"


def back_edges(g: nx.DiGraph, root: str = "start") -> set[tuple[str, str]]:
    """The arcs that close a cycle: inside one strongly connected component, an arc to a node no
    farther from ``root`` (breadth-first distance) than its source. Every cycle has one (distances
    cannot grow all the way round), so removing them leaves the graph acyclic; and a node is
    never pushed below the node that loops back to it -- both debaters a judge sends back stay
    on the layer ``start`` gives them, whatever the order of the arcs.

    >>> sorted(back_edges(nx.DiGraph([("start", "a"), ("start", "b"), ("a", "t"), ("b", "t"), ("t", "j"),
    ...                                ("j", "u"), ("u", "a"), ("u", "b"), ("u", "end")])))
    [('u', 'a'), ('u', 'b')]
    """
    dist = nx.single_source_shortest_path_length(g, root) if root in g else {}
    far = len(g) + 1  # a node start cannot reach (never in a checked workflow) sorts last
    comp = {n: k for k, c in enumerate(nx.strongly_connected_components(g)) for n in c}
    return {(u, v) for u, v in g.edges
            if comp[u] == comp[v] and dist.get(v, far) <= dist.get(u, far)}


def _grandalf(g: nx.DiGraph, back: set[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    from grandalf.graphs import Edge, Graph, Vertex  # type: ignore[import-untyped]
    from grandalf.layouts import SugiyamaLayout  # type: ignore[import-untyped]

    class _View:  # grandalf reads a vertex's size from .view and writes its position there
        w, h, xy = 1.0, 1.0, (0.0, 0.0)

    vertices = {n: Vertex(n) for n in g.nodes}
    for v in vertices.values():
        v.view = _View()
    edges = {(u, v): Edge(vertices[u], vertices[v]) for u, v in g.edges if u != v}
    graph = Graph(list(vertices.values()), list(edges.values()))
    pos: dict[str, tuple[float, float]] = {}
    for comp in graph.C:
        sug = SugiyamaLayout(comp)
        sug.xspace, sug.yspace = 0.3, 1.0
        roots = [vertices["start"]] if vertices["start"] in comp.sV else None
        sug.init_all(roots=roots, inverted_edges=[e for (u, v), e in edges.items() if (u, v) in back and e in comp.sE])
        sug.draw(3)
        for v in comp.sV:
            x, _ = v.view.xy
            pos[v.data] = (x / (1.0 + sug.xspace), float(sug.grx[v].rank))
    return pos


def _dot(g: nx.DiGraph, back: set[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("Graphviz `dot` is not on PATH")
    ids = {n: f"n{i}" for i, n in enumerate(g.nodes)}
    lines = ["digraph g {", "  rankdir=TB; nodesep=0.3; ranksep=0.5;",
             "  node [shape=box, fixedsize=true, width=1, height=0.5, label=\"\"];"]
    lines += [f"  {ids[n]};" for n in g.nodes]
    for u, v in g.edges:
        if u != v:  # a back edge is given reversed: dot layers the same acyclic graph as grandalf
            lines.append(f"  {ids[v]} -> {ids[u]};" if (u, v) in back else f"  {ids[u]} -> {ids[v]};")
    lines.append("}")
    out = subprocess.run([exe, "-Tplain"], input="\n".join(lines), capture_output=True, text=True,
                         timeout=DOT_TIMEOUT_S, check=True).stdout
    by_id = {i: n for n, i in ids.items()}
    raw: dict[str, tuple[float, float]] = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "node":
            raw[by_id[parts[1]]] = (float(parts[2]), float(parts[3]))
    ys = sorted({round(y, 3) for _, y in raw.values()}, reverse=True)  # dot's y grows upwards
    rank = {y: k for k, y in enumerate(ys)}
    return {n: (x / 1.3, float(rank[round(y, 3)])) for n, (x, y) in raw.items()}  # 1.3 in = width + nodesep


ENGINES: dict[str, Callable[[nx.DiGraph, set[tuple[str, str]]], dict[str, tuple[float, float]]]] = {
    "grandalf": _grandalf,
    "dot": _dot,
}


def default_engine() -> str:
    """``dot`` when Graphviz is on ``PATH``, else ``grandalf``."""
    return "dot" if shutil.which("dot") else "grandalf"


def layout(workflow: Workflow, engine: str = "auto") -> Layout:
    """Place every node of ``workflow.graph()`` on a layer.

    Args:
        workflow: the workflow.
        engine: ``auto`` (``dot`` when on ``PATH``, else ``grandalf``), ``grandalf`` or ``dot``.
    Returns:
        The layout; ``engine`` says which engine made it (``dot`` failing falls back to grandalf).
    Raises:
        ValueError: an unknown engine.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> layout(w, "grandalf").layers
    [['start'], ['a'], ['t'], ['end']]
    """
    if engine not in ("auto", *ENGINES):
        raise ValueError(f"unknown layout engine {engine!r} (known: auto, {', '.join(ENGINES)})")
    chosen = default_engine() if engine == "auto" else engine
    g = nx.DiGraph(workflow.graph())
    back = back_edges(g, "start")
    try:
        pos = ENGINES[chosen](g, back)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError, KeyError):
        if chosen == "grandalf":
            raise
        chosen, pos = "grandalf", _grandalf(g, back)  # a broken Graphviz: the pure-Python layout
    last = max((y for n, (_, y) in pos.items() if n != "end"), default=0.0)
    if "end" in pos:
        pos["end"] = (pos["end"][0], last + 1)  # end alone on the last layer
    # columns: shift so the widest layer is centred on 0
    xs = [x for x, _ in pos.values()]
    mid = (min(xs) + max(xs)) / 2 if xs else 0.0
    pos = {n: (round(x - mid, 4), y) for n, (x, y) in pos.items()}
    num_layers = int(max(y for _, y in pos.values())) + 1
    layers = [sorted((n for n in pos if int(pos[n][1]) == k), key=lambda n: pos[n][0]) for k in range(num_layers)]
    layers = [layer for layer in layers if layer]
    renumber = {n: float(k) for k, layer in enumerate(layers) for n in layer}
    pos = {n: (x, renumber[n]) for n, (x, _) in pos.items()}
    return Layout(pos, layers, frozenset(back), chosen)
