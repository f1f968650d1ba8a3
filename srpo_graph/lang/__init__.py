"""The workflow language: ``.wf`` text -> AST (:mod:`.parser`) -> checked :class:`Workflow` (:mod:`.checker`).

Stage: lang, the first of the pipeline. Also the canonical formatter (:mod:`.fmt`) and the
``check`` summary (:mod:`.summary`). Public verbs: :func:`load_workflow`, :func:`parse`,
:func:`check`, :func:`format_source`.
"""

from __future__ import annotations

from pathlib import Path

from srpo_graph.workflow import Workflow


def parse(text: str, path: str = "<string>"):
    """Parse ``.wf`` text into an AST; see :func:`srpo_graph.lang.parser.parse`."""
    from srpo_graph.lang.parser import parse as _parse

    return _parse(text, path)


def check(module, source: str | None = None, **kw) -> Workflow:
    """Check an AST into a :class:`Workflow`; see :func:`srpo_graph.lang.checker.check`."""
    from srpo_graph.lang.checker import check as _check

    return _check(module, source, **kw)


def format_source(text: str, path: str = "<string>") -> str:
    """The canonical form of ``.wf`` text; see :func:`srpo_graph.lang.fmt.format_source`."""
    from srpo_graph.lang.fmt import format_source as _fmt

    return _fmt(text, path)


def load_workflow(path: str | Path) -> Workflow:
    """Read, parse and check a ``.wf`` file.

    Args:
        path: the file.

    Returns:
        The checked :class:`Workflow` (its spans point into ``path``).

    Raises:
        WorkflowSyntaxError: the file cannot be read, is not UTF-8 or does not parse.
        WorkflowCheckError: a name, type or graph rule is broken (every problem is listed).
    """
    from srpo_graph.lang.checker import check as _check
    from srpo_graph.lang.parser import parse as _parse
    from srpo_graph.lang.parser import read_source

    text = read_source(path)
    return _check(_parse(text, str(path)), text)


__all__ = ["load_workflow", "parse", "check", "format_source"]
