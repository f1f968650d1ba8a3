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

from srpo_graph.viz.layout import layout
from srpo_graph.viz.text import policy_colors, sizes_label
from srpo_graph.workflow import END, Workflow

X_GAP, Y_GAP = 2.6, 1.5
AGENT_W, AGENT_H = 1.9, 0.62
BAR_W, BAR_H = 1.9, 0.26


def _figure(w: Workflow):
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Patch, Rectangle

    lay = layout(w)
    pos = {n: (x * X_GAP, -y * Y_GAP) for n, (x, y) in lay.pos.items()}
    xs = [p[0] for p in pos.values()]
    width = max(xs) - min(xs) + 2 * X_GAP
    height = len(lay.layers) * Y_GAP + 1.2
    fig = Figure(figsize=(max(4.0, width * 1.1), max(3.0, height * 0.95)), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(min(xs) - X_GAP * 0.9, max(xs) + X_GAP * 0.9)
    ax.set_ylim(-(len(lay.layers) - 1) * Y_GAP - 0.8, 1.3)
    ax.set_aspect("equal")
    colors = policy_colors(w)
    kinds = {a.name: "agent" for a in w.agents} | {t.name: "transition" for t in w.transitions}
    patches = {}
    for n, (x, y) in pos.items():
        kind = kinds.get(n, n)
        if kind == "agent":
            agent = w.agent_by_name[n]
            p = FancyBboxPatch((x - AGENT_W / 2, y - AGENT_H / 2), AGENT_W, AGENT_H,
                               boxstyle="round,pad=0.02,rounding_size=0.22",
                               fc=colors.get(agent.policy, "#cccccc"), ec="#222222", lw=1.2, zorder=3)
            ax.add_patch(p)
            ax.text(x, y + 0.08, n, ha="center", va="center", fontsize=10, color="white", weight="bold", zorder=4)
            ax.text(x, y - 0.17, agent.policy, ha="center", va="center", fontsize=7, color="white", zorder=4)
        elif kind == "transition":
            t = w.transition_by_name[n]
            p = Rectangle((x - BAR_W / 2, y - BAR_H / 2), BAR_W, BAR_H, fc="#333333", ec="#111111", zorder=3)
            ax.add_patch(p)
            ax.text(x, y, n, ha="center", va="center", fontsize=8, color="white", zorder=4)
            note = sizes_label(t.set_sizes) + (f"  ≤{t.max_rounds} rounds" if t.max_rounds else "")
            if t.reward is not None:
                note += f"  r={t.reward.function}"
            ax.text(x + 0.12, y - BAR_H / 2 - 0.04, note, ha="left", va="top", fontsize=7, color="#333333", zorder=4,
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
        elif n == "start":
            p = Circle((x, y), 0.13, fc="black", zorder=3)
            ax.add_patch(p)
            ax.text(x + 0.2, y, "start", ha="left", va="center", fontsize=8)
        else:
            ax.add_patch(Circle((x, y), 0.18, fc="white", ec="black", lw=1.5, zorder=3))
            p = Circle((x, y), 0.11, fc="black", zorder=4)
            ax.add_patch(p)
            ax.text(x + 0.25, y, "end", ha="left", va="center", fontsize=8)
        patches[n] = p
    style = {"start": ("#555555", ":"), "consume": ("#888888", "-"), "activate": ("#111111", "-"),
             "route": ("#c0392b", "--")}
    seen_pairs: dict[tuple[str, str], int] = {}
    for u, v, data in w.graph().edges(data=True):
        color, ls = style[data["kind"]]
        k = seen_pairs.get((u, v), 0)
        seen_pairs[(u, v)] = k + 1
        back = (u, v) in lay.back_edges or pos[v][1] >= pos[u][1]
        rad = (0.5 if back else 0.0) + 0.15 * k
        arrow = FancyArrowPatch(pos[u], pos[v], patchA=patches[u], patchB=patches[v], arrowstyle="-|>",
                                mutation_scale=12, color=color, ls=ls, lw=1.3,
                                connectionstyle=f"arc3,rad={rad}", zorder=2)
        ax.add_patch(arrow)
        if data["kind"] == "route":
            (x1, y1), (x2, y2) = pos[u], pos[v]
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            if rad:
                mx, my = mx + rad * (y2 - y1) * 0.5, my - rad * (x2 - x1) * 0.5
            ax.text(mx, my, data.get("label", ""), fontsize=8, color=color, ha="center", va="center", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
    handles = [Patch(fc=colors[p.name], ec="#222222", label=f"{p.name} = {p.model}") for p in w.policies]
    if handles:
        ax.legend(handles=handles, loc="upper right", fontsize=7, title="policies", title_fontsize=7, frameon=False)
    ax.text(min(xs) - X_GAP * 0.85, 1.15, w.name, fontsize=11, ha="left", va="top", weight="bold")
    return fig


def to_png(w: Workflow, dpi: int = 110) -> bytes:
    """The routing graph as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure(w)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def to_svg(w: Workflow) -> str:
    """The routing graph as an SVG document (deterministic: no date, fixed ids)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    fig = _figure(w)
    FigureCanvasSVG(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "srpo-graph", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()
