"""Python callables a ``.wf`` file names: resolve its imports and check call signatures.

Stage: lang (check). Consumes the import statements and calls of a module, produces the Python
module objects and, for each call, whether its arguments fit the function's signature and
annotations (as ``.wf`` types). ``std`` is :mod:`srpo_graph.std`; any other module is imported
with the ``.wf`` file's directory put first on ``sys.path``. Knows nothing of graphs.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from srpo_graph.supervisor import running
from srpo_graph.workflow import (
    BoolType,
    ChoiceType,
    FloatType,
    IntType,
    ListType,
    RecordType,
    TextType,
    WfType,
    type_str,
)

STD_MODULE = "srpo_graph.std"


def python_module_name(dotted: str) -> str:
    """The importable module for a ``.wf`` import: ``std`` is the built-in library.

    >>> python_module_name("std"), python_module_name("my_tools")
    ('srpo_graph.std', 'my_tools')
    """
    return STD_MODULE if dotted == "std" else dotted


def import_module(dotted: str, base_dir: Path | None) -> types.ModuleType:
    """Import the module a ``.wf`` file names, with ``base_dir`` first on ``sys.path``.

    Raises:
        ImportError: the module cannot be found or its import raised anything at all, also
            ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` (the cause is
            chained): a module's code must never end or fool the checker (``SystemExit(0)``
            would otherwise exit 0 and "accept" the file).
    """
    name = python_module_name(dotted)
    added = base_dir is not None and str(base_dir) not in sys.path
    if added:
        sys.path.insert(0, str(base_dir))
    try:
        with running(f"the import of module {name!r}" + (f" (from {base_dir})" if base_dir is not None else "")):
            return importlib.import_module(name)  # (named if it ends the process: supervisor.py)
    except ImportError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user module that fails (or exits) while importing
        raise ImportError(f"importing {name!r} raised {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            try:
                sys.path.remove(str(base_dir))
            except ValueError:
                pass


# --------------------------------------------------------------------------- annotations


def _hints(fn: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: judge nothing we cannot read
        return {}


def _strip_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return ann


def accepts(ann: Any, t: WfType) -> bool:
    """Whether a parameter annotated ``ann`` accepts a ``.wf`` value of type ``t``.

    >>> accepts(float, IntType()), accepts(int, TextType()), accepts(str, ChoiceType(options=("a",)))
    (True, False, True)
    """
    ann = _strip_optional(ann)
    if ann in (inspect.Parameter.empty, Any, object) or isinstance(ann, (str, typing.TypeVar)):
        return True
    origin = typing.get_origin(ann) or ann
    if ann is str:
        return isinstance(t, TextType) or (isinstance(t, ChoiceType) and not t.multi)
    if ann is bool:
        return isinstance(t, BoolType)
    if ann is int:
        return isinstance(t, (IntType, BoolType))
    if ann is float:
        return isinstance(t, (FloatType, IntType, BoolType))
    if origin in (list, tuple, Sequence, typing.Sequence):
        item_args = typing.get_args(ann)
        item = item_args[0] if item_args else Any
        if isinstance(t, ListType):
            return accepts(item, t.item)
        return isinstance(t, ChoiceType) and t.multi and accepts(item, TextType())
    if origin in (dict, Mapping, typing.Mapping):
        return isinstance(t, RecordType)
    return True  # a class we do not model: do not judge


def wf_type_of(ann: Any) -> WfType | None:
    """The ``.wf`` type of a return annotation, or None when it has none we can model.

    >>> type_str(wf_type_of(list[str]))
    'list[text]'
    """
    ann = _strip_optional(ann)
    simple: dict[Any, WfType] = {str: TextType(), int: IntType(), float: FloatType(), bool: BoolType()}
    if ann in simple:
        return simple[ann]
    origin = typing.get_origin(ann) or ann
    if origin is typing.Literal:
        return _choice_of(ann)
    if origin in (list, tuple, Sequence, set, frozenset):
        args = typing.get_args(ann)
        item = wf_type_of(args[0]) if args else None
        if isinstance(item, ChoiceType) and not item.multi:  # list[Literal[...]]: a subset of labels
            return ChoiceType(options=item.options, multi=True)
        return ListType(item=item) if item is not None and origin is not set and origin is not frozenset else None
    if origin in (dict, Mapping):
        return RecordType(fields=())
    return None


def _choice_of(ann: Any) -> ChoiceType | None:
    """``Literal["stop", "again"]`` -> ``choice[stop, again]``: labels are distinct identifiers
    (a route case names them), else None.

    >>> type_str(_choice_of(typing.Literal["stop", "again"]))
    'choice[stop, again]'
    >>> _choice_of(typing.Literal["a b"]) is None, _choice_of(typing.Literal[1, 2]) is None
    (True, True)
    """
    values = typing.get_args(ann)
    if values and all(isinstance(v, str) and v.isidentifier() for v in values) and len(set(values)) == len(values):
        return ChoiceType(options=tuple(values))
    return None


def returns_fit(declared: WfType, ann: Any) -> bool:
    """Whether a function annotated to return ``ann`` can produce an output declared ``declared``.

    >>> returns_fit(ChoiceType(options=("a", "b")), str), returns_fit(IntType(), str)
    (True, False)
    """
    ann = _strip_optional(ann)
    if ann in (inspect.Parameter.empty, inspect.Signature.empty, Any, object) or isinstance(ann, str):
        return True
    if isinstance(declared, ChoiceType):
        return accepts(ann, TextType()) if not declared.multi else returns_fit(ListType(item=TextType()), ann)
    origin = typing.get_origin(ann) or ann
    if isinstance(declared, RecordType):
        return origin in (dict, Mapping)
    if isinstance(declared, ListType):
        if origin not in (list, tuple, Sequence):
            return False
        args = typing.get_args(ann)
        return not args or returns_fit(declared.item, args[0])
    if isinstance(declared, FloatType):
        return ann in (float, int)
    return wf_type_of(ann) == declared


@dataclass(frozen=True)
class ArgProblem:
    """One problem with a call: ``index`` is the positional argument, ``keyword`` the keyword
    argument it is about (both None: the call as a whole)."""

    message: str
    index: int | None = None
    keyword: str | None = None


def check_call(
    fn: Callable,
    arg_types: Sequence[WfType | None],
    kwarg_types: Mapping[str, WfType | None],
    *,
    leading: Sequence[WfType] = (),
) -> list[ArgProblem]:
    """Check a call's arity and argument types against ``fn``'s signature.

    ``leading`` are arguments the runtime passes first (an extractor's completion text).
    A ``None`` type means "unknown" (already reported elsewhere) and is not judged.

    >>> from srpo_graph import std
    >>> [p.message for p in check_call(std.equals, [IntType()], {})]
    ["missing a required argument: 'b'"]
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    positional = list(leading) + list(arg_types)
    try:
        bound = sig.bind(*range(len(positional)), **{k: -1 for k in kwarg_types})
    except TypeError as exc:
        import re

        # point at the argument the problem is about: an unknown or doubled keyword, the first extra positional
        named = re.search(r"(?:unexpected keyword argument|multiple values for argument) '(\w+)'", str(exc))
        if named:
            return [ArgProblem(str(exc), keyword=named.group(1))]
        if "too many positional" in str(exc):
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            first_extra = sum(p.kind in kinds for p in sig.parameters.values()) - len(leading)
            return [ArgProblem(str(exc), index=max(first_extra, 0))]
        return [ArgProblem(str(exc))]
    hints = _hints(fn)
    problems: list[ArgProblem] = []
    for pname, value in bound.arguments.items():
        param = sig.parameters[pname]
        ann = hints.get(pname, param.annotation)
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            pairs = [(None, kwarg_types[k], k) for k in value]
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            pairs = [(i, positional[i], pname) for i in value]
        elif value == -1:
            pairs = [(None, kwarg_types[pname], pname)]
        else:
            pairs = [(value, positional[value], pname)]
        for index, t, label in pairs:
            if t is None or accepts(ann, t):
                continue
            arg_index = None if index is None else index - len(leading)
            if arg_index is not None and arg_index < 0:
                problems.append(ArgProblem(f"its parameter {label!r} takes {_ann_str(ann)}, not the completion text"))
            else:
                problems.append(ArgProblem(f"parameter {label!r} takes {_ann_str(ann)}, got {type_str(t)}", arg_index,
                                           keyword=label if index is None else None))
    return problems


def return_annotation(fn: Callable) -> Any:
    hints = _hints(fn)
    if "return" in hints:
        return hints["return"]
    try:
        return inspect.signature(fn).return_annotation
    except (TypeError, ValueError):
        return inspect.Signature.empty


def _ann_str(ann: Any) -> str:
    ann = _strip_optional(ann)
    t = wf_type_of(ann)
    if t is not None:
        return type_str(t) if not isinstance(t, RecordType) else "a record"
    return getattr(ann, "__name__", str(ann))
