"""Checking ``policy p = lora("base", r=.., alpha=.., targets=[..])``: LoRA adapter policies.

Stage: lang (check). Consumes the :class:`~srpo_graph.lang.ast.LoraExpr` of a policy
declaration and the full policies declared so far; produces a
:class:`~srpo_graph.workflow.Policy` whose ``adapter`` is set and whose ``model`` is the base's.
Rules: the base names a declared full policy (an adapter on an adapter is refused), ``r`` is an
integer > 0, ``alpha`` > 0, ``0 <= dropout < 1``, ``targets`` is a non-empty list without
repeats and, when the base model's weights are on this machine (a local folder, ``tiny`` or
a recipe model once built), every target is a module of that architecture.

The module names come from the safetensors headers (JSON, read without loading a tensor), so
checking never imports torch or transformers. A hub name that is not on disk is not looked up:
its targets are checked when the trainer loads the model (peft then names the missing module).
"""

from __future__ import annotations

import json
import os
import struct
from functools import lru_cache
from pathlib import Path

from srpo_graph.errors import Span
from srpo_graph.lang import ast
from srpo_graph.workflow import LoraAdapter, Policy

_KEYS = ("r", "alpha", "targets", "dropout")


def _home() -> Path:
    # the same folder as srpo_graph.models.tiny.default_dir (lang may not import backends)
    home = os.environ.get("SRPO_GRAPH_HOME")
    return Path(home) if home else Path.home() / ".cache" / "srpo-graph"


def model_dir(model: str, base_dir: Path | None = None) -> Path | None:
    """The local folder holding ``model``'s weights, or None (a hub name not on disk).

    >>> model_dir("no/such-model") is None
    True
    """
    candidates = [Path(model)]
    if base_dir is not None:
        candidates.append(base_dir / model)
    if "/" not in model and model:  # "tiny" and recipe names are built under the srpo-graph home
        candidates.append(_home() / model)
    for c in candidates:
        try:
            if c.is_dir() and any(c.glob("*.safetensors")):
                return c
        except OSError:
            continue
    return None


@lru_cache(maxsize=32)
def _names_in(folder: str) -> frozenset[str]:
    names: set[str] = set()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for key, meta in header.items():
            parts = key.split(".")
            # a weight matrix names its module: model.layers.0.self_attn.q_proj.weight -> q_proj
            if len(parts) >= 2 and parts[-1] == "weight" and len(meta.get("shape", ())) == 2:
                names.add(parts[-2])
    return frozenset(names)


def module_names(model: str, base_dir: Path | None = None) -> frozenset[str] | None:
    """The names of ``model``'s weight-matrix modules (LoRA targets), or None when unknown.

    >>> module_names("no/such-model") is None
    True
    """
    folder = model_dir(model, base_dir)
    if folder is None:
        return None
    try:
        return _names_in(str(folder.resolve())) or None
    except (OSError, ValueError, struct.error):  # an unreadable header: leave it to the loader
        return None


def check_lora(ck, decl: ast.PolicyDecl, full: dict[str, Policy], adapters: dict[str, str]) -> Policy:
    """The adapter policy ``decl`` declares, its problems reported to ``ck`` (a checker scope).

    Args:
        ck: the checker (``err``, ``base_dir``).
        decl: a policy declaration whose model is a :class:`~srpo_graph.lang.ast.LoraExpr`.
        full: the workflow's full (non-adapter) policies by name.
        adapters: every adapter policy's name -> the base it names (for a better message).
    Returns:
        The policy; when it has errors, one without an adapter (so agents naming it do not
        report follow-on errors; the errors already stop the check).
    """
    expr: ast.LoraExpr = decl.model  # type: ignore[assignment]
    errors_before = len(ck.sink.errors)
    base_name = expr.base.value
    base = full.get(base_name)
    if base is None:
        known = ", ".join(sorted(full)) or "none"
        hint = (f"an adapter cannot be the base of another adapter; use its base '{adapters[base_name]}'"
                if base_name in adapters else
                f'name a policy declared with a model, e.g. `policy base = "tiny"` (declared: {known})')
        ck.err(
            f"unknown base policy '{base_name}' for adapter '{decl.name.value}'", expr.base.span, hint, "unknown-name"
        )
    values: dict[str, object] = {}
    seen: dict[str, Span] = {}
    for arg in expr.args:
        key = arg.key.value
        if key not in _KEYS:
            ck.err(f"unknown lora argument '{key}'", arg.key.span, f"lora takes {', '.join(_KEYS)}", "unknown-field")
        elif ck.unique(arg.key, seen, "lora argument"):
            value = _value(ck, key, arg)
            if value is not None:
                values[key] = value
    targets = next(
        (a.value for a in expr.args if a.key.value == "targets" and isinstance(a.value, ast.ModuleList)), None
    )
    names = module_names(base.model, ck.base_dir) if base is not None and targets is not None else None
    for n in targets.names if targets is not None and names is not None else ():
        if names is not None and n.value not in names:
            ck.err(
                f"module '{n.value}' is not in the architecture of base '{base_name}' ({base.model if base else '?'})",
                n.span,
                f"LoRA can target: {', '.join(sorted(names))}",
                "unknown-module",
            )
    if len(ck.sink.errors) > errors_before:
        return Policy(name=decl.name.value, model=base.model if base is not None else "", span=decl.span)
    assert base is not None  # no error was reported, so the base resolved
    adapter = LoraAdapter(base=base_name, **values)
    return Policy(name=decl.name.value, model=base.model, adapter=adapter, span=decl.span)


def _value(ck, key: str, arg: ast.LoraArg):
    v = arg.value
    if key == "targets":
        if not isinstance(v, ast.ModuleList):
            ck.err(
                "`targets` must be a list of module names", arg.span, "e.g. targets=[q_proj, v_proj]", "type-mismatch"
            )
            return None
        if not v.names:
            ck.err("`targets` is empty", v.span, "name at least one module, e.g. targets=[q_proj, v_proj]", "bad-value")
            return None
        seen: dict[str, Span] = {}
        unique = [n.value for n in v.names if ck.unique(n, seen, "lora target")]
        return tuple(unique) if len(unique) == len(v.names) else None
    if not isinstance(v, ast.NumberLit):
        ck.err(
            f"`{key}` must be a number",
            arg.span,
            f"e.g. {key}=8" if key == "r" else f"e.g. {key}=16" if key == "alpha" else f"e.g. {key}=0.05",
            "type-mismatch",
        )
        return None
    x = v.value
    if key == "r" and (not isinstance(x, int) or x <= 0):
        ck.err(f"rank `r` must be an integer > 0, got {x}", v.span, "e.g. r=8 or r=16", "bad-value")
        return None
    if key == "alpha" and not x > 0:
        ck.err(
            f"`alpha` must be > 0, got {x}", v.span, "the update is scaled by alpha / r; e.g. alpha=2*r", "bad-value"
        )
        return None
    if key == "dropout" and not 0 <= x < 1:
        ck.err(
            f"`dropout` must be in [0, 1), got {x}",
            v.span,
            "the share of inputs dropped, e.g. dropout=0.05",
            "bad-value",
        )
        return None
    return float(x) if key in ("alpha", "dropout") else x
