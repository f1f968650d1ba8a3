"""Routing-graph pictures: exact by construction (text forms) and readable images (SVG/PNG)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.viz import FORMATS, to_dot, to_mermaid, to_png, to_svg, write_graph
from srpo_graph.viz.layout import layout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "workflows").glob("*.wf"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_text_forms_have_every_edge(path: Path) -> None:
    w = load_workflow(path)
    g = w.graph()
    dot = to_dot(w)
    assert len(re.findall(r" -> ", dot)) == g.number_of_edges()
    for t in w.transitions:
        assert f'"{t.name}"' in dot
    mmd = to_mermaid(w)
    assert len(re.findall(r"^  n\d+ [-=.]+>", mmd, flags=re.M)) == g.number_of_edges()
    lay = layout(w)
    assert set(lay.pos) == set(g.nodes)
    assert lay.layers[0] == ["start"] and lay.layers[-1] == ["end"]
    for u, v in g.edges():  # every forward edge goes down a layer; back edges close cycles
        assert lay.pos[u][1] < lay.pos[v][1] or (u, v) in lay.back_edges


@pytest.mark.parametrize("stem", ["coord_routed", "search"])
def test_images(stem: str, tmp_path: Path) -> None:
    from matplotlib.image import imread

    w = load_workflow(ROOT / "workflows" / f"{stem}.wf")
    png = to_png(w)
    img = imread(io.BytesIO(png), format="png")
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert img[..., :3].std() > 0.05  # not a blank canvas
    svg = to_svg(w)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "searcher" in svg or "dispatch" in svg
    assert to_svg(w) == svg  # deterministic
    assert w._repr_svg_() == svg
    for suffix in FORMATS:
        out = write_graph(w, tmp_path / f"g{suffix}")
        assert out.stat().st_size > 0


def test_unknown_format(tmp_path: Path) -> None:
    w = load_workflow(ROOT / "workflows" / "coord_seq.wf")
    with pytest.raises(ValueError, match="unknown picture format"):
        write_graph(w, tmp_path / "g.jpg")


@pytest.mark.parametrize("stem", [p.stem for p in EXAMPLES])
def test_transition_notes_overlap_no_arc_or_label(stem: str) -> None:
    """Each transition's note box is clear of every arc and every other text (rendered geometry)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import FancyArrowPatch

    from srpo_graph.viz.render import _figure, _note

    w = load_workflow(ROOT / "workflows" / f"{stem}.wf")
    fig = _figure(w)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    note_texts = {_note(t) for t in w.transitions}
    notes = [t for t in ax.texts if t.get_text() in note_texts]
    assert len(notes) == len(w.transitions)
    others = [t for t in ax.texts if t not in notes]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert arrows
    for note in notes:
        box = note.get_bbox_patch().get_window_extent(renderer)
        for other in others:
            assert not box.overlaps(other.get_window_extent(renderer)), (note.get_text(), other.get_text())
        for arrow in arrows:
            dense = arrow.get_transform().transform(arrow.get_path().interpolated(50).vertices)  # data -> pixels
            inside = [(x, y) for x, y in dense if box.contains(x, y)]
            assert not inside, (note.get_text(), inside[:3])
