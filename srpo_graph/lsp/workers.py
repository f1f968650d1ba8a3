"""What the language server runs on worker threads: the analysis (with the garbage collector
off), the warm-ups at start, and ``check``'s token rule.

Stage: lsp. Used by :mod:`.server` (Note [Analysis off the loop] there).
"""

from __future__ import annotations

import gc
import threading
from concurrent.futures import Future

from srpo_graph.errors import Diagnostic
from srpo_graph.lsp.document import Analysis, analyze

# Note [No garbage collection during an analysis]
# The cyclic garbage collector is off while an analysis runs (``analyze_without_gc``): an analysis
# allocates steadily, which made CPython run full collections over the growing heap again and
# again -- measured on 3,000 agents, seven of them, up to 1 s each, during which no thread runs
# (the loop's worst hover) and about half of the analysis's time. Its garbage is freed by reference
# counting as before; the cycles, by the next collection once no analysis runs (0.25 s there).
_GC_LOCK = threading.Lock()
_gc_holders = 0  # analyses running with the collector off


def analyze_without_gc(text: str, path: str) -> Analysis:
    """:func:`~srpo_graph.lsp.document.analyze` with the collector off (Note above)."""
    global _gc_holders
    with _GC_LOCK:
        _gc_holders += 1
        gc.disable()
    try:
        return analyze(text, path)
    finally:
        with _GC_LOCK:
            _gc_holders -= 1
            if _gc_holders == 0:
                gc.enable()


_TOKENIZERS = threading.Lock()  # a fast tokenizer must not be used by two threads at once


def token_diagnostics(a: Analysis) -> list[Diagnostic]:
    """``check``'s token rule (``allow`` entries are single tokens; prompt text the tokenizer
    does not know) against the local tokenizers, as ``srpo-graph check`` runs it."""
    from srpo_graph.runtime.tokens import check_local_tokens

    assert a.workflow is not None
    with _TOKENIZERS:
        try:
            return check_local_tokens(a.workflow)
        except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot load: said, not fatal
            return [Diagnostic(f"the token check could not run: {type(exc).__name__}: {exc}", None,
                               code="token-check", severity="warning")]


_WARM_TEXT = ('workflow w import std task { q: text } policy p = "tiny"'
              ' agent a { policy: p prompt: "{task.q}" } start: a')


def warm_analysis(ready: Future) -> None:
    """Import what an analysis needs and build the grammar on one thread before any analysis runs
    (two threads' first imports of the same modules could meet half-initialized modules)."""
    try:
        analyze(_WARM_TEXT, "<warm>")
    finally:
        ready.set_result(None)


def warm_tokens(analysis_ready: Future) -> None:
    analysis_ready.result()  # after the analysis's imports (warm_analysis)
    with _TOKENIZERS:
        from transformers import PreTrainedTokenizerFast  # noqa: F401  (what the tiny tokenizer loads)

        import srpo_graph.runtime.tokens  # noqa: F401
