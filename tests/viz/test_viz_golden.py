"""Golden pictures of every shipped workflow plus a loop back to a pair (a debate whose judge sends
both debaters back): node positions and label positions as drawn, compared with
``tests/viz/golden/<name>.json`` (layout engine pinned to grandalf, the pure-Python default; regenerate with
``SRPO_GRAPH_REGEN_GOLDEN=1`` and review the diff), and the rendered geometry of both engines
checked: no two boxes overlap, no route label, transition note or node name lies on a box or on
another label, every loop target stays above the transition that loops back to it, and every
``start`` arc is drawn.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CASES = sorted((ROOT / "workflows").glob("*.wf")) + [GOLDEN / "debate_pair.wf"]
REGEN = os.environ.get("SRPO_GRAPH_REGEN_GOLDEN") == "1"
ENGINES = ["grandalf"] + (["dot"] if shutil.which("dot") else [])


def _drawn(path: Path, engine: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from srpo_graph.viz.render import _figure

    w = load_workflow(path)
    fig = _figure(w, engine=engine)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return w, fig, canvas.get_renderer()


def _r(v: float) -> float:
    return round(float(v), 3)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_positions_match_the_golden_picture(path: Path) -> None:
    from srpo_graph.viz.render import positions

    w, fig, _ = _drawn(path, "grandalf")
    lay, pos, _ = positions(w, engine="grandalf")
    ax = fig.axes[0]
    labels = {t.get_gid(): [_r(t.get_position()[0]), _r(t.get_position()[1])]
              for t in ax.texts if (t.get_gid() or "").startswith(("route:", "note:"))}
    actual = json.dumps({"engine": lay.engine, "layers": lay.layers,
                         "nodes": {n: [_r(x), _r(y)] for n, (x, y) in sorted(pos.items())},
                         "labels": dict(sorted(labels.items()))}, indent=1, ensure_ascii=False) + "\n"
    golden = GOLDEN / f"{path.stem}.json"
    if REGEN or not golden.exists():
        if not REGEN:
            pytest.fail(f"missing golden file {golden}; run with SRPO_GRAPH_REGEN_GOLDEN=1")
        golden.write_text(actual, encoding="utf-8")
    assert actual == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_no_box_or_label_overlaps(path: Path, engine: str) -> None:
    from matplotlib.patches import FancyArrowPatch

    w, fig, renderer = _drawn(path, engine)
    ax = fig.axes[0]
    boxes = {p.get_gid(): p.get_window_extent(renderer) for p in ax.patches
             if (p.get_gid() or "").startswith(("agent:", "transition:", "node:"))}
    assert len(boxes) == len(w.agents) + len(w.transitions) + 2
    names = list(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    floating = [t for t in ax.texts if (t.get_gid() or "").startswith(("route:", "note:"))
                or t.get_gid() in ("name:start", "name:end")]
    extents = {t.get_gid(): (t.get_bbox_patch() or t).get_window_extent(renderer) for t in floating}
    for gid, ext in extents.items():
        for box_gid, box in boxes.items():
            assert not ext.overlaps(box), (gid, box_gid)
        for other, ext2 in extents.items():
            assert other == gid or not ext.overlaps(ext2), (gid, other)
    # every loop target is drawn above the transition that loops back to it
    from srpo_graph.viz.render import positions

    lay, pos, _ = positions(w, engine=engine)
    for u, v in lay.back_edges:
        assert pos[v][1] > pos[u][1], (u, v)
    # every start arc is drawn, and ends at its agent
    arcs = {p.get_gid() for p in ax.patches if isinstance(p, FancyArrowPatch)}
    assert {f"arc:start->{a}:0" for a in w.start} <= arcs


def test_the_debaters_a_judge_sends_back_share_the_layer_under_start() -> None:
    from srpo_graph.viz.layout import layout

    w = load_workflow(GOLDEN / "debate_pair.wf")
    for engine in ENGINES:
        lay = layout(w, engine)
        assert lay.layers[:3] == [["start"], ["pro", "con"], ["exchange"]] and lay.layers[-1] == ["end"], engine
        assert lay.back_edges == {("verdict", "pro"), ("verdict", "con")}


def test_tools_are_drawn_on_their_transition() -> None:
    from srpo_graph.viz import to_dot, to_mermaid, to_svg

    w = load_workflow(ROOT / "workflows" / "search.wf")
    assert "tool docs=retrieve" in to_svg(w, engine="grandalf")
    assert "docs = std.retrieve" in to_dot(w) and "docs = std.retrieve" in to_mermaid(w)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_the_legend_names_each_policy_once_as_declared(path: Path) -> None:
    """Issue 39, item 7: a frozen local policy's legend read ``judge = tiny" frozen (frozen)``. Every
    entry is ``name = model`` with balanced quotes and its status (frozen, frozen base, external) once."""
    import re

    w, fig, _ = _drawn(path, "grandalf")
    legend = fig.axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()] if legend is not None else []
    assert len(texts) == len(w.policies)
    for p, text in zip(w.policies, texts):
        assert text.startswith(f"{p.name} = "), text
        assert text.count('"') % 2 == 0, text
        assert len(re.findall(r"\bfrozen\b", text)) == (1 if p.frozen or p.external or p.name in w.frozen_bases
                                                          else 0), text
