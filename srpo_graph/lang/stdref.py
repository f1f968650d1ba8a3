"""The reference of the ``std`` library, generated from its code (``docs/std.md``).

Stage: lang (a helper of ``check``'s documentation). Consumes :mod:`srpo_graph.std`; produces a
markdown page: every public function, its signature as the checker reads it, what it does (its
docstring's first paragraph) and what it gives for a missing value -- found by calling it, not
written by hand: an extractor is called on the empty completion, a reward and a tool with
``None`` as the value they judge (the ``*values`` when the function has them, else the first
parameter). ``tests/lang/test_stdref.py`` fails when ``docs/std.md`` is not what this prints.

Regenerate: ``python -m srpo_graph.lang.stdref > docs/std.md``.
"""

from __future__ import annotations

import inspect
import typing

from srpo_graph import std
from srpo_graph.lang.callables import wf_type_of
from srpo_graph.workflow import type_str

_SAMPLE: dict[typing.Any, typing.Any] = {int: 3, float: 0.5, str: "x", bool: True}
_EXTRA = {"pattern": r"(\d+)"}  # an extractor's literal arguments, for the call on an empty completion


def std_functions() -> list[tuple[str, typing.Callable]]:
    """The public functions of ``std``, in source order."""
    fns = [(n, f) for n, f in vars(std).items()
           if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == std.__name__]
    return sorted(fns, key=lambda nf: inspect.getsourcelines(nf[1])[1])


def kind_of(fn: typing.Callable) -> str:
    """``extractor`` (takes the completion ``text`` first), ``tool`` (returns text to the state) or ``reward``."""
    params = list(inspect.signature(fn).parameters)
    if params and params[0] == "text":
        return "extractor"
    ret = typing.get_type_hints(fn).get("return")
    return "reward" if ret is float else "tool"


def _on_missing(fn: typing.Callable, kind: str) -> str:
    if kind == "extractor":
        extra = [_EXTRA.get(p.name, "x") for p in list(inspect.signature(fn).parameters.values())[1:]
                 if p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
        try:
            return f"`{fn('', *extra)!r}` on an empty completion"
        except ValueError:
            return "raises `ValueError` on an empty completion: the output's value is `None`"
    hints = typing.get_type_hints(fn)
    args: list[typing.Any] = []
    none_at_varargs = False
    params = list(inspect.signature(fn).parameters.values())
    has_var = any(p.kind is p.VAR_POSITIONAL for p in params)
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            args.append(None)
            none_at_varargs = True
        elif p.default is p.empty:
            args.append(None if (i == 0 and not has_var) else _SAMPLE.get(hints.get(p.name), "x"))
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the reference says what really happens
        return f"raises `{type(exc).__name__}` when {'a value' if none_at_varargs else 'its first argument'} is `None`"
    return f"`{result!r}` when {'a value' if none_at_varargs else 'its first argument'} is `None`"


def _signature(name: str, fn: typing.Callable) -> str:
    hints = typing.get_type_hints(fn)
    ann = lambda a: getattr(a, "__name__", None) if isinstance(a, type) else str(a).replace("typing.", "")  # noqa: E731
    parts = []
    for p in inspect.signature(fn).parameters.values():
        star = "*" if p.kind is p.VAR_POSITIONAL else ""
        text = f"{star}{p.name}" + (f": {ann(hints[p.name])}" if p.name in hints else "")
        parts.append(text + (f" = {p.default!r}" if p.default is not p.empty else ""))
    ret = f" -> {ann(hints['return'])}" if "return" in hints else ""
    return f"{name}({', '.join(parts)}){ret}"


def std_entry(name: str, fn: typing.Callable) -> tuple[str, str, str]:
    """(kind, signature, what it does) of one ``std`` function: a row of ``docs/std.md``, and
    what an editor shows on hover (``srpo_graph.lsp``).

    >>> std_entry("equals", std.equals)[:2]
    ('reward', 'equals(a: int, b: int) -> float')
    """
    doc = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return kind_of(fn), _signature(name, fn), doc


def std_reference() -> str:
    """The markdown reference of ``std`` (what ``docs/std.md`` holds).

    >>> "| `digit` |" in std_reference()
    True
    """
    rows = ["# The `std` library", "",
            "Generated from `srpo_graph/std.py` by `python -m srpo_graph.lang.stdref > docs/std.md` "
            "(`tests/lang/test_stdref.py` keeps it current). `import std` gives a `.wf` file these functions. "
            "An **extractor** is used as `output: T via std.NAME` and is called with the completion text "
            "first; a **reward** in `reward:`; a **tool** in `tool NAME = std.f(...)`. The last column is "
            "found by calling the function: an extractor on the empty completion, a reward or tool with "
            "`None` as the value it judges.", "",
            "| function | kind | signature | `.wf` type | what it does | on a missing value |",
            "|---|---|---|---|---|---|"]
    for name, fn in std_functions():
        kind, sig, doc = std_entry(name, fn)
        doc = doc.replace("|", "\\|")
        ret = typing.get_type_hints(fn).get("return")
        wf_t = wf_type_of(ret) if ret is not None else None
        rows.append(f"| `{name}` | {kind} | `{sig}` | {type_str(wf_t) if wf_t is not None else '-'} | {doc} | "
                    f"{_on_missing(fn, kind).replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(std_reference(), end="")
