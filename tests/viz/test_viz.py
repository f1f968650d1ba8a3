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
