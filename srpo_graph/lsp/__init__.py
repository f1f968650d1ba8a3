"""Editor support: the Language Server of ``.wf`` files (``srpo-graph lsp``).

Stage: lsp, after lang and viz: it reuses the parser, the checker, the formatter and the
``std`` reference of :mod:`srpo_graph.lang` (no rule is repeated here) and ``viz``'s SVG, and
answers an editor over the Language Server Protocol (stdio, pygls): diagnostics, hover,
definition, references, completion, rename, outline, formatting (:mod:`.server`). Needs the
``lsp`` extra (``pip install "srpo-graph[lsp]"``). See docs/editor.md. The modules:
``server.py`` (the server and its requests), ``document.py`` (one document parsed, checked,
indexed), ``symbols.py`` (declarations and uses), ``features.py`` (hover, definition, references,
rename, outline, formatting), ``completion.py``, ``positions.py`` (spans <-> LSP positions),
``pyfiles.py`` (user modules read with ``ast``), ``imports.py`` (the import check in a child
process), ``framing.py`` (the stdio transport, which survives framing faults), ``workers.py``
(what runs on worker threads), ``commands.py`` (``lsp``).
"""

from __future__ import annotations


def serve() -> int:
    """Run the language server on stdin/stdout (what ``srpo-graph lsp`` does); returns the exit
    status the protocol asks for (0 after ``shutdown`` then ``exit``, 1 on ``exit`` alone)."""
    from srpo_graph.lsp.server import serve as _serve

    return _serve()


__all__ = ["serve"]
