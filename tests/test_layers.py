"""Architecture contract: a stage imports only from stages to its left (DESIGN.md).

Reads every module's imports with ``ast`` (nothing is imported), so a violation is reported
with the file and line of the offending import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "srpo_graph"

# Pipeline order. Shared helpers (rank 0) may be imported by everyone and import no stage.
RANK = {
    "errors": 0,
    "exiting": 0,
    "workflow": 0,
    "std": 0,
    "lang": 1,
    "models": 2,
    "viz": 3,
    "backends": 3,
    "runtime": 4,
    "eval": 5,  # scoring episodes (Avg@k, Pass@k, intervals): after runtime, no torch
    "compiler": 5,
    "srpo": 6,
    "train": 7,
    "lsp": 8,  # the editor's language server: lang (and viz) behind an LSP front end
    "cli": 9,
}
# workflow.py draws itself in notebooks through a lazy import of viz (inside a method).
ALLOWED = {("workflow", "viz")}


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "srpo_graph" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path, package: str | None = None):
    """(line, absolute module) of every import; relative ones resolved against ``package``
    (the importing module's package, e.g. ``srpo_graph.lang``)."""
    if package is None and PKG in path.parents:
        package = ".".join(("srpo_graph", *path.relative_to(PKG).parent.parts))
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module:
                    yield node.lineno, node.module
                continue
            base = (package or "").split(".")
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            if node.module:
                yield node.lineno, ".".join([*base, node.module])
            else:  # from .. import trainer: each name may be a module
                for alias in node.names:
                    yield node.lineno, ".".join([*base, alias.name])


def _violations() -> list[str]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        own = rel.parts[0].removesuffix(".py")
        if own not in RANK:
            continue
        for lineno, module in _imports(path):
            other = _stage_of(module)
            if other is None or other == own or other not in RANK or (own, other) in ALLOWED:
                continue
            if RANK[other] > RANK[own] or (RANK[other] == RANK[own] and RANK[own] > 0):
                found.append(f"srpo_graph/{rel}:{lineno}: stage '{own}' imports later stage '{other}' ({module})")
    return found


def test_every_stage_module_is_ranked():
    stages = {p.name.removesuffix(".py") for p in PKG.iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    stages -= {"__init__", "__main__"}
    assert stages <= set(RANK), f"unranked stages: {sorted(stages - set(RANK))}"


def test_stages_import_only_leftwards():
    violations = _violations()
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("bad", ["srpo_graph.train.trainer"])
def test_the_check_detects_a_backward_import(tmp_path, bad):
    # The contract test must be able to fail: a lang module importing the trainer is caught.
    src = tmp_path / "m.py"
    src.write_text(f"import {bad}\n")
    assert [m for _, m in _imports(src)] == [bad]
    assert RANK[_stage_of(bad)] > RANK["lang"]


@pytest.mark.parametrize("line", ["from ..train import trainer", "from ..train.trainer import train",
                                  "from srpo_graph.train import trainer"])
def test_the_check_resolves_relative_imports(tmp_path, line):
    """``from ..train import trainer`` inside lang/ is the same backward import, written relatively."""
    src = tmp_path / "m.py"
    src.write_text(line + "\n")
    modules = [m for _, m in _imports(src, package="srpo_graph.lang")]
    assert any(_stage_of(m) == "train" for m in modules), modules


# ----------------------------------------------------------------------------- inside train/
# The trainer's packages in pipeline order (DESIGN.md, "The trainer's layout"): a module of train/
# imports only train/ modules of an earlier rank (or its own package), also inside functions.
# parallel comes before config because the config's `strategy` choices are parallel/'s STRATEGIES table.
TRAIN_RANK = {
    "parallel": 0,
    "config": 1,
    "checkpoint": 2,
    "policies": 3,
    "rollout": 4,
    "learn": 5,
    "sync": 6,
    "observe": 7,
    "stops": 8,
    "run_folder": 8,
    "trainer": 9,
    "eval_command": 9,
    "commands": 10,
    "__main__": 11,
}
NEVER = {("rollout", "learn"), ("learn", "rollout")}  # two stages of the loop: neither knows the other
TRAIN = PKG / "train"


def _train_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["srpo_graph", "train"] else None


def _train_violations(root: Path = TRAIN) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        own = rel.parts[0].removesuffix(".py")
        if own == "__init__":
            continue  # the package itself: the callable srpo_graph.train(...) forwards to trainer.train
        for lineno, module in _imports(path):
            other = _train_part(module)
            if other is None or other == own or other == "__init__":
                continue
            if own not in TRAIN_RANK or other not in TRAIN_RANK:
                found.append(f"srpo_graph/train/{rel}:{lineno}: unranked part of train/ ({own!r} or {other!r}): "
                             "add it to TRAIN_RANK")
            elif TRAIN_RANK[other] >= TRAIN_RANK[own] or (own, other) in NEVER:
                found.append(f"srpo_graph/train/{rel}:{lineno}: train/{own} imports train/{other} ({module}), "
                             f"which is not before it in the loop")
    return found


def test_every_part_of_train_is_ranked():
    parts = {p.name.removesuffix(".py") for p in TRAIN.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts - {"__init__"} <= set(TRAIN_RANK), sorted(parts - {"__init__"} - set(TRAIN_RANK))


def test_train_imports_only_earlier_parts():
    violations = _train_violations()
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("planted,part", [("from srpo_graph.train.trainer import train", "rollout"),
                                          ("from srpo_graph.train.learn import step", "rollout"),
                                          ("from srpo_graph.train.observe.record import StepRecord", "config")])
def test_the_train_check_finds_a_planted_upward_import(tmp_path, planted, part):
    """The check can fail: a module of train/<part>/ with an upward import (inside a function, too)
    is reported with its file and line."""
    path = tmp_path / "train" / part / "planted.py"
    path.parent.mkdir(parents=True)
    path.write_text(f"def f():\n    {planted}\n")
    found = _train_violations(tmp_path / "train")
    assert len(found) == 1 and f"train/{part}/planted.py:2" in found[0], found


def test_scoring_imports_no_model_code():
    """srpo_graph/eval/ (Avg@k, Pass@k, intervals) runs where no model does: no torch, transformers
    or trainer import, even inside a function."""
    heavy = ("torch", "transformers", "safetensors", "srpo_graph.train", "srpo_graph.backends")
    found = [f"srpo_graph/eval/{p.name}:{line}: {m}" for p in sorted((PKG / "eval").rglob("*.py"))
             for line, m in _imports(p) if m.split(".")[0] in heavy or m.startswith(heavy)]
    assert not found, "\n".join(found)
