"""The workflow language: ``.wf`` text -> AST (:mod:`.parser`) -> checked :class:`Workflow` (:mod:`.checker`).

Stage: lang, the first of the pipeline. Public verbs: :func:`load_workflow`, :func:`parse`,
:func:`check`, :func:`format_source`. The modules: ``parser.py`` (Lark -> AST with spans),
``build.py`` (the Lark transformer), ``ast.py`` (one dataclass per rule), ``templates.py``
(strings and ``{reference}`` holes), ``checker.py`` (the check driver), ``scope.py`` (names, types,
references, calls), ``agents.py`` and ``transitions.py`` (one declaration each), ``analysis.py``
(graph rules and proven facts), ``firing.py`` (the firing rule), ``explore.py`` (every run of it
over all route choices), ``advice.py`` (warnings about the models), ``callables.py`` (the one
importer of user modules), ``adapters.py`` (``lora(...)``), ``chat.py`` (chat agents),
``external.py`` (frozen and external policies), ``fmt.py`` (the canonical formatter),
``summary.py`` (what ``check`` prints), ``stdref.py`` (the ``std`` reference), ``commands.py``
(``check``, ``fmt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from srpo_graph.workflow import Workflow


def parse(text: str, path: str = "<string>"):
    """Parse ``.wf`` text into its syntax tree (see :func:`srpo_graph.lang.parser.parse`).

    Args:
        text: the source.
        path: the file name used in spans and error messages.

    Returns:
        The :class:`~srpo_graph.lang.ast.Module` (names and types not yet checked).

    Raises:
        WorkflowSyntaxError: the text does not match the grammar.

    >>> parse('workflow w "demo"').header.description.value
    'demo'
    """
    from srpo_graph.lang.parser import parse as _parse

    return _parse(text, path)


def check(module, source: str | None = None, **kw) -> Workflow:
    """Check a parsed module into a :class:`Workflow` (see :func:`srpo_graph.lang.checker.check`).

    Args:
        module: what :func:`parse` returned.
        source: its text, to render errors (default: the module's own).
        **kw: ``base_dir``, the directory searched first for imported modules.

    Returns:
        The checked workflow, with proven active-set sizes.

    Raises:
        WorkflowCheckError: a name, type or graph rule is broken (every problem is listed).

    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> [a.name for a in w.agents], w.transitions[0].set_sizes
    (['a'], (1,))
    """
    from srpo_graph.lang.checker import check as _check

    return _check(module, source, **kw)


def format_source(text: str, path: str = "<string>") -> str:
    """The canonical form of ``.wf`` text (see :func:`srpo_graph.lang.fmt.format_source`).

    Args:
        text: the source.
        path: the file name used in error messages.

    Returns:
        The formatted text; formatting it again changes nothing.

    Raises:
        WorkflowSyntaxError: the text does not parse.

    >>> format_source('workflow w  start:a')
    'workflow w\\n\\nstart: a\\n'
    """
    from srpo_graph.lang.fmt import format_source as _fmt

    return _fmt(text, path)


def load_workflow(path: str | Path, models: Mapping[str, str] | None = None) -> Workflow:
    """Read, parse and check a ``.wf`` file.

    Args:
        path: the file.
        models: the run's model per policy (``*`` = every policy), as ``run --model`` and
            ``rollout.models`` give them: the check's model rules (a chat agent's template,
            ``allow`` tokens, the advice) then judge the models that will run, not the declared
            ones (issue 39, item 6). ``lora(...)`` and ``openai(...)`` policies keep their own.

    Returns:
        The checked :class:`Workflow` (its spans point into ``path``).

    Raises:
        WorkflowSyntaxError: the file cannot be read, is not UTF-8 or does not parse.
        WorkflowCheckError: a name, type or graph rule is broken (every problem is listed).

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     f = pathlib.Path(d, "w.wf")
    ...     _ = f.write_text('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                      ' transition t { consume: a activate: end } start: a', encoding="utf-8")
    ...     load_workflow(f).name
    'w'
    """
    from srpo_graph.lang.checker import check as _check
    from srpo_graph.lang.parser import parse as _parse
    from srpo_graph.lang.parser import read_source

    text = read_source(path)
    module = _parse(text, str(path))
    if models:
        module = with_models(module, models)
    return _check(module, text)


def with_models(module, models: Mapping[str, str]):
    """``module`` with each named policy's model string replaced (``*``: every plain-model policy)."""
    import dataclasses

    from srpo_graph.lang import ast

    items = []
    for it in module.items:
        if isinstance(it, ast.PolicyDecl) and isinstance(it.model, ast.StringLit):
            model = models.get(it.name.value, models.get("*"))
            if model is not None:
                it = dataclasses.replace(it, model=dataclasses.replace(it.model, value=str(model)))
        items.append(it)
    return dataclasses.replace(module, items=tuple(items) if isinstance(module.items, tuple) else items)


__all__ = ["load_workflow", "parse", "check", "format_source", "with_models"]
