"""Pictures of a workflow's routing graph: SVG, PNG (matplotlib, no Graphviz), DOT and Mermaid.

Stage: viz. Consumes a checked :class:`~srpo_graph.workflow.Workflow`; produces images or text.
"""

from __future__ import annotations

from pathlib import Path

from srpo_graph.viz.text import to_dot, to_mermaid
from srpo_graph.workflow import Workflow


def to_svg(workflow: Workflow) -> str:
    """The routing graph as an SVG document (matplotlib; imported lazily)."""
    from srpo_graph.viz.render import to_svg as _svg

    return _svg(workflow)


def to_png(workflow: Workflow, dpi: int = 110) -> bytes:
    """The routing graph as PNG bytes (matplotlib; imported lazily)."""
    from srpo_graph.viz.render import to_png as _png

    return _png(workflow, dpi)


FORMATS = {".svg": to_svg, ".png": to_png, ".dot": to_dot, ".gv": to_dot, ".mmd": to_mermaid}


def write_graph(workflow: Workflow, path: str | Path) -> Path:
    """Draw ``workflow`` into ``path``; the format follows the suffix (.svg .png .dot .gv .mmd).

    Raises:
        ValueError: the suffix names no known format.
    """
    path = Path(path)
    fn = FORMATS.get(path.suffix.lower())
    if fn is None:
        raise ValueError(f"unknown picture format {path.suffix!r}: use one of {', '.join(FORMATS)}")
    data = fn(workflow)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


__all__ = ["to_svg", "to_png", "to_dot", "to_mermaid", "write_graph", "FORMATS"]
