"""Draw the routing graph as SVG or PNG with matplotlib (no Graphviz needed).

Stage: viz. Consumes a :class:`~srpo_graph.workflow.Workflow` and the layered
:func:`~srpo_graph.viz.layout.layout`; produces image bytes. Agents are rounded boxes filled
with their policy's colour; transitions are dark bars labelled with their name and set sizes;
``start`` is a dot, ``end`` a ringed dot. Consumption arcs are grey, activations black, routed
arcs dashed and labelled with their choice; arcs that close a cycle curve back up.
Uses matplotlib's object API (no pyplot global state), so it is safe in servers and tests.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from srpo_graph.viz.layout import layout
from srpo_graph.viz.text import legend_label, policy_caption, policy_colors, sizes_label
from srpo_graph.workflow import Workflow

X_GAP, Y_GAP = 2.6, 1.5
AGENT_W, AGENT_H = 1.9, 0.62
BAR_W, BAR_H = 1.9, 0.26
NOTE_FONT = 7  # points
NOTE_PAD = 0.12  # between a bar's right end and its note, in data units
INCH_PER_UNIT = 1.1  # figure inches per data unit (see the figsize below)
# Note [Transition notes]
# A transition's note ("|S|=1  r=equals") sits to the RIGHT of its bar, vertically centred, in a
# white box no taller than the bar. Arcs leave a bar through its top or bottom edge (layers are
# 1.5 apart, neighbours 2.6+ apart, so the line from the centre always exits there) and route
# labels sit mid-way between layers, so usually nothing else is drawn there; the horizontal gap
# between neighbours grows to fit the widest note. An arc that skips layers (e.g. a route straight
# to `end`) can pass beside a bar: then the note goes to the LEFT, the first side that meets no
# arc, route label, node or earlier note (tests/viz checks the rendered geometry).


def _note(t) -> str:
    """The annotation of a transition: set sizes, loop bound, reward, and its tools (drawn on
    the transition they run in: ``tool docs=retrieve``)."""
    note = sizes_label(t.set_sizes) + (f"  ≤{t.max_rounds} rounds" if t.max_rounds else "")
    if t.reward is not None:
        note += f"  r={t.reward.function}"
    for tc in t.tools:
        note += f"  tool {tc.name}={tc.call.function}"
    return note


def _note_width(text: str) -> float:
    """A generous estimate of the note's width in data units (DejaVu Sans ~0.6 em per char)."""
    return len(text) * NOTE_FONT * 0.62 / 72 / INCH_PER_UNIT + 0.1


def _node_box(n: str, xy: tuple[float, float], kind: str) -> tuple[float, float, float, float]:
    """The region a node (with its own caption) covers, in data units."""
    x, y = xy
    half_w, half_h = {"agent": (AGENT_W / 2, AGENT_H / 2), "transition": (BAR_W / 2, BAR_H / 2)}.get(kind, (0.7, 0.2))
    return (x - half_w, y - half_h, x + half_w, y + half_h)


def _blocked(box, arrows, taken) -> bool:
    """Whether ``box`` (x0, y0, x1, y1) meets an arc's path or another drawn thing."""
    x0, y0, x1, y1 = box
    m = 0.05  # margin
    if any(x0 - m <= px <= x1 + m and y0 - m <= py <= y1 + m for pts in arrows for px, py in pts):
        return True
    return any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in taken)


# Note [Back edges]
# A back edge that climbs more than one layer (a judge's `again` route back to the debaters) is
# not drawn straight: it would cross the boxes in between and its label would land on one. It
# leaves the top of its transition bar near the side, runs out to a vertical channel outside every
# box (and transition note) of the layers it spans -- left for a target on the left half, right
# otherwise, one channel per such edge, each further out -- climbs, and enters its target from the
# side (from above when the target has a neighbour on that side). Its route label sits on the
# channel. A back edge to the next layer up (a searcher's `search` loop) stays a short curve.


def _dense(points: list[tuple[float, float]], per_segment: int = 12) -> list[tuple[float, float]]:
    """Points along a polyline (for the overlap tests of notes)."""
    out: list[tuple[float, float]] = []
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        out.extend((x0 + (x1 - x0) * i / per_segment, y0 + (y1 - y0) * i / per_segment) for i in range(per_segment))
    out.append(points[-1])
    return out


def _channels(w: Workflow, lay, pos, kinds, notes) -> dict[tuple[str, str], tuple[float, list[tuple[float, float]]]]:
    """``(u, v) -> (channel x, polyline)`` for each back edge spanning more than one layer."""
    layer = {n: int(y) for n, (_, y) in lay.pos.items()}
    half = {n: AGENT_W / 2 if kinds.get(n) == "agent" else BAR_W / 2 if kinds.get(n) == "transition" else 0.35
            for n in pos}
    out: dict[tuple[str, str], tuple[float, list[tuple[float, float]]]] = {}
    used = {-1: 0, 1: 0}
    centre = sum(x for x, _ in pos.values()) / max(1, len(pos))
    for u, v in sorted(lay.back_edges, key=lambda e: (layer[e[1]], pos[e[1]][0], e[0])):
        if u not in pos or v not in pos or layer[u] - layer[v] <= 1:
            continue
        side = -1 if pos[v][0] <= centre else 1
        span = [n for n in pos if layer[v] <= layer[n] <= layer[u]]
        if side < 0:
            edge = min(pos[n][0] - half[n] for n in span)  # notes prefer the right side
        else:
            edge = max(pos[n][0] + half[n] + (NOTE_PAD + _note_width(notes[n]) + 0.1 if notes.get(n) else 0)
                       for n in span)
        cx = edge + side * (0.45 + 0.4 * used[side])
        used[side] += 1
        (xu, yu), (xv, yv) = pos[u], pos[v]
        start = (xu + side * half[u] * 0.8, yu + BAR_H / 2)
        lift = (start[0], yu + 0.38)
        same_layer = [n for n in pos if layer[n] == layer[v] and n != v]
        blocked = any((pos[n][0] - xv) * side > 0 for n in same_layer)
        if blocked:  # a neighbour on that side: come in from above
            top = yv + AGENT_H / 2
            points = [start, lift, (cx, lift[1]), (cx, top + 0.35), (xv + side * half[v] * 0.6, top + 0.35),
                      (xv + side * half[v] * 0.6, top)]
        else:
            points = [start, lift, (cx, lift[1]), (cx, yv), (xv + side * half[v], yv)]
        out[(u, v)] = (cx, points)
    return out


OFF = "#d0d7de"  # what an episode did not use (Usage)


@dataclass(frozen=True)
class Usage:
    """What one episode did, drawn over the routing graph (``srpo-graph show --html``).

    Used parts are drawn as usual with captions; the rest in grey. Built by
    ``runtime.episode_view.usage`` from a trace.

    Attributes:
        agents: outputs per agent (0 or absent: not run).
        fired: firings per transition.
        arcs: the (from, to) node pairs the episode used.
        agent_notes: a caption per agent that ran (e.g. ``×2 → 7``).
        transition_notes: a note per transition that fired (e.g. ``×1  r=1``).
        end_note: the caption of ``end`` (status and reward).
    """

    agents: dict[str, int] = field(default_factory=dict)
    fired: dict[str, int] = field(default_factory=dict)
    arcs: frozenset[tuple[str, str]] = frozenset()
    agent_notes: dict[str, str] = field(default_factory=dict)
    transition_notes: dict[str, str] = field(default_factory=dict)
    end_note: str = "end"


def positions(w: Workflow, usage: Usage | None = None, engine: str = "auto"):
    """(layout, node centres in data units, transition notes): what the picture places where."""
    lay = layout(w, engine)
    notes = {t.name: _note(t) for t in w.transitions}
    if usage is not None:  # what the episode did, instead of the static annotations
        notes = {t.name: usage.transition_notes.get(t.name, "") for t in w.transitions}
    widest = max((_note_width(s) for s in notes.values()), default=0.0)
    x_gap = max(X_GAP, BAR_W / 2 + NOTE_PAD + widest + 0.15 + AGENT_W / 2)  # Note [Transition notes]
    pos = {n: (x * x_gap, -y * Y_GAP) for n, (x, y) in lay.pos.items()}
    return lay, pos, notes


def _figure(w: Workflow, usage: Usage | None = None, engine: str = "auto"):
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

    lay, pos, notes = positions(w, usage, engine)
    widest = max((_note_width(s) for s in notes.values()), default=0.0)
    kinds = {a.name: "agent" for a in w.agents} | {t.name: "transition" for t in w.transitions}
    channels = _channels(w, lay, pos, kinds, notes)
    xs = [p[0] for p in pos.values()]
    margin = max(X_GAP * 0.9, BAR_W / 2 + NOTE_PAD + widest + 0.1)  # room for a note on either side
    left, right = min(xs) - margin, max(xs) + margin
    left = min([left] + [c[0] - 0.9 for c in channels.values()])
    right = max([right] + [c[0] + 0.9 for c in channels.values()])
    height = len(lay.layers) * Y_GAP + 1.2
    fig = Figure(figsize=(max(4.0, (right - left) * INCH_PER_UNIT), max(3.0, height * 0.95)), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(left, right)
    ax.set_ylim(-(len(lay.layers) - 1) * Y_GAP - 0.8, 1.3)
    ax.set_aspect("equal")
    colors = policy_colors(w)
    patches: dict[str, Patch] = {}
    for n, (x, y) in pos.items():
        p: Patch
        kind = kinds.get(n, n)
        if kind == "agent":
            agent = w.agent_by_name[n]
            ran = usage is None or usage.agents.get(n, 0) > 0
            caption = policy_caption(w, agent.policy) if usage is None else usage.agent_notes.get(n, "not run")
            p = FancyBboxPatch((x - AGENT_W / 2, y - AGENT_H / 2), AGENT_W, AGENT_H,
                               boxstyle="round,pad=0.02,rounding_size=0.22",
                               fc=colors.get(agent.policy, "#cccccc") if ran else "#f6f8fa",
                               ec="#222222" if ran else OFF, lw=1.2, zorder=3, gid=f"agent:{n}")
            ax.add_patch(p)
            ink = "white" if ran else "#888888"
            ax.text(x, y + 0.08, n, ha="center", va="center", fontsize=10, color=ink, weight="bold", zorder=4,
                    gid=f"name:{n}")
            ax.text(x, y - 0.17, caption, ha="center", va="center", fontsize=7, color=ink, zorder=4, gid=f"caption:{n}")
        elif kind == "transition":
            fired = usage is None or usage.fired.get(n, 0) > 0
            p = Rectangle((x - BAR_W / 2, y - BAR_H / 2), BAR_W, BAR_H, fc="#333333" if fired else "#eeeeee",
                          ec="#111111" if fired else OFF, zorder=3, gid=f"transition:{n}")
            ax.add_patch(p)
            ax.text(x, y, n, ha="center", va="center", fontsize=8, color="white" if fired else "#999999", zorder=4,
                    gid=f"name:{n}")
        elif n == "start":
            p = Circle((x, y), 0.13, fc="black", zorder=3, gid="node:start")
            ax.add_patch(p)
            ax.text(x + 0.2, y, "start", ha="left", va="center", fontsize=8, gid="name:start")
        else:
            ax.add_patch(Circle((x, y), 0.18, fc="white", ec="black", lw=1.5, zorder=3))
            p = Circle((x, y), 0.11, fc="black", zorder=4, gid="node:end")
            ax.add_patch(p)
            ax.text(x + 0.25, y, "end" if usage is None else usage.end_note, ha="left", va="center", fontsize=8,
                    gid="name:end")
        patches[n] = p
    style = {"start": ("#555555", ":"), "consume": ("#888888", "-"), "activate": ("#111111", "-"),
             "route": ("#c0392b", "--")}
    seen_pairs: dict[tuple[str, str], int] = {}
    route_labels: list[tuple[str, str, tuple[float, float, float, float]]] = []  # placed so far
    arrows, taken = [], [_node_box(n, pos[n], kinds.get(n, n)) for n in pos]
    for u, v, data in w.graph().edges(data=True):
        color, ls = style[data["kind"]]
        used = usage is None or (u, v) in usage.arcs
        label_color = color if used else "#999999"
        lw = 1.3
        if usage is not None:  # used arcs black and thick, the others grey (route labels keep their colour)
            color, lw = ("#111111", 2.4) if used else (OFF, 1.0)
        k = seen_pairs.get((u, v), 0)
        seen_pairs[(u, v)] = k + 1
        back = (u, v) in lay.back_edges or pos[v][1] >= pos[u][1]
        rad = (0.5 if back else 0.0) + 0.15 * k
        channel = channels.get((u, v)) if k == 0 else None
        if channel is not None:  # Note [Back edges]: up a side channel, clear of every box
            from matplotlib.path import Path as MplPath

            points = channel[1]
            arrow = FancyArrowPatch(path=MplPath(points), arrowstyle="-|>", mutation_scale=12, color=color, ls=ls,
                                    lw=lw, zorder=2, gid=f"arc:{u}->{v}:{k}")
        else:
            arrow = FancyArrowPatch(pos[u], pos[v], patchA=patches[u], patchB=patches[v], arrowstyle="-|>",
                                    mutation_scale=12, color=color, ls=ls, lw=lw,
                                    connectionstyle=f"arc3,rad={rad}", zorder=2, gid=f"arc:{u}->{v}:{k}")
        ax.add_patch(arrow)
        arrows.append(arrow.get_path().interpolated(40).vertices if channel is None
                      else _dense(channel[1]))  # data coordinates, clipped at the nodes
        if data["kind"] == "route":
            (x1, y1), (x2, y2) = pos[u], pos[v]
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            if channel is not None:  # on the channel, half-way up
                mx, my = channel[0], (channel[1][2][1] + channel[1][3][1]) / 2
            elif rad:
                mx, my = mx + rad * (y2 - y1) * 0.5, my - rad * (x2 - x1) * 0.5
            text = data.get("label", "")
            half = _note_width(text) / 2

            def clash(y: float) -> tuple[str, str] | None:  # the (source, label) of a route label in the way
                return next(((su, st) for su, st, (a, b, c, d) in route_labels
                             if a < mx + half and mx - half < c and b < y + 0.15 and y - 0.15 < d), None)

            hit = clash(my)
            if hit == (u, text):  # one label of one route case to several agents: shown once is enough
                continue
            for dy in (0.0, 0.32, -0.32, 0.64, -0.64, 0.96, -0.96):
                if clash(my + dy) is None:
                    my += dy
                    break
            ax.text(mx, my, text, fontsize=8, color=label_color, ha="center", va="center", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9), gid=f"route:{u}->{v}:{k}")
            taken.append((mx - half, my - 0.15, mx + half, my + 0.15))
            route_labels.append((u, text, taken[-1]))
    for t in w.transitions:  # Note [Transition notes]: right of the bar, else left, whichever is clear
        if not notes[t.name]:
            continue
        x, y = pos[t.name]
        width = _note_width(notes[t.name])
        for side in (1, -1, 1):
            near = x + side * (BAR_W / 2 + NOTE_PAD)
            box = (min(near, near + side * width), y - BAR_H / 2, max(near, near + side * width), y + BAR_H / 2)
            if not _blocked(box, arrows, taken):
                break
        taken.append(box)
        ax.text(near, y, notes[t.name], ha="left" if side > 0 else "right", va="center", fontsize=NOTE_FONT,
                color="#333333", zorder=6, bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#bbbbbb", lw=0.6),
                gid=f"note:{t.name}")
    handles = [Patch(fc=colors[p.name], ec="#222222", label=legend_label(w, p.name)) for p in w.policies]
    if handles:
        ax.legend(handles=handles, loc="upper right", fontsize=7, title="policies", title_fontsize=7, frameon=False)
    ax.text(left + X_GAP * 0.05, 1.15, w.name, fontsize=11, ha="left", va="top", weight="bold", gid="title")
    return fig


def to_png(w: Workflow, dpi: int = 110, usage: Usage | None = None, engine: str = "auto") -> bytes:
    """The routing graph as PNG bytes (with what one episode did, given its ``usage``; ``engine``:
    the layout's, :data:`srpo_graph.viz.layout.ENGINES` or ``auto``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure(w, usage, engine)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def to_svg(w: Workflow, usage: Usage | None = None, engine: str = "auto") -> str:
    """The routing graph as an SVG document (deterministic: no date, fixed ids); with what one
    episode did when ``usage`` is given (nodes and arcs carry ids ``agent:NAME``,
    ``transition:NAME``, ``arc:FROM->TO:K``)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    fig = _figure(w, usage, engine)
    FigureCanvasSVG(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "srpo-graph", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()
