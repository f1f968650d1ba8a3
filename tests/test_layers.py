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
