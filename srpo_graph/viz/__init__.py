"""Pictures of a workflow's routing graph: SVG, PNG (matplotlib; laid out by grandalf, or Graphviz's
``dot`` when it is on ``PATH``), DOT and Mermaid.

Stage: viz. Consumes a checked :class:`~srpo_graph.workflow.Workflow`; produces images or text.
The modules: ``layout.py`` (the layered layout), ``render.py`` (the one renderer), ``text.py``
(DOT and Mermaid), ``commands.py`` (``viz``); this one exports ``to_svg``, ``to_png``,
``write_graph``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from srpo_graph.viz.text import to_dot, to_mermaid
from srpo_graph.workflow import Workflow


def to_svg(workflow: Workflow, engine: str = "auto") -> str:
    """The routing graph as an SVG document (matplotlib, imported lazily; no Graphviz).

    Args:
        workflow: a checked workflow.
        engine: the layout engine: ``auto`` (``dot`` when on ``PATH``, else ``grandalf``),
            ``grandalf`` or ``dot`` (:data:`srpo_graph.viz.layout.ENGINES`).

    Returns:
        The SVG text; deterministic (no date, fixed ids), so it can be committed or diffed.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> svg = to_svg(w)
    >>> svg.startswith("<?xml") and "|S|=1" in svg
    True
    """
    from srpo_graph.viz.render import to_svg as _svg

    return _svg(workflow, engine=engine)


def to_png(workflow: Workflow, dpi: int = 110, engine: str = "auto") -> bytes:
    """The routing graph as PNG bytes (matplotlib, imported lazily; no Graphviz).

    Args:
        workflow: a checked workflow.
        dpi: resolution of the image.
        engine: the layout engine (as for :func:`to_svg`).

    Returns:
        The PNG file's bytes.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> to_png(w, dpi=40)[:4]
    b'\\x89PNG'
    """
    from srpo_graph.viz.render import to_png as _png

    return _png(workflow, dpi, engine=engine)


FORMATS: dict[str, Callable[[Workflow], str | bytes]] = {
    ".svg": to_svg,
    ".png": to_png,
    ".dot": to_dot,
    ".gv": to_dot,
    ".mmd": to_mermaid,
}


def write_graph(workflow: Workflow, path: str | Path, engine: str = "auto") -> Path:
    """Draw ``workflow`` into ``path``; the format follows the suffix (.svg .png .dot .gv .mmd).

    Args:
        workflow: a checked workflow.
        path: the file to write (replaced if it exists).
        engine: the layout engine of an SVG or PNG picture (as for :func:`to_svg`).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: the suffix names no known format.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> write_graph(w, "graph.jpg")
    Traceback (most recent call last):
    ValueError: unknown picture format '.jpg': use one of .svg, .png, .dot, .gv, .mmd
    """
    path = Path(path)
    fn = FORMATS.get(path.suffix.lower())
    if fn is None:
        raise ValueError(f"unknown picture format {path.suffix!r}: use one of {', '.join(FORMATS)}")
    data = fn(workflow, engine=engine) if path.suffix.lower() in (".svg", ".png") else fn(workflow)  # type: ignore[call-arg]
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


__all__ = ["to_svg", "to_png", "to_dot", "to_mermaid", "write_graph", "FORMATS"]
