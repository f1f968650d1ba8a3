"""Architecture contract: (a) a stage imports only from stages to its left (DESIGN.md); (b) no
module imports a module that imports it, even inside a function (no import cycles).

Reads every module's imports with ``ast`` (nothing is imported), so a violation is reported
with the file and line of the offending import.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parents[1] / "srpo_graph"

# Pipeline order. Shared helpers (rank 0) may be imported by everyone and import no stage.
RANK = {
    "errors": 0,
    "exiting": 0,
    "supervisor": 0,  # the supervising parent of the commands that run user code
    "workflow": 0,
    "std": 0,
    "hfcache": 0,  # the local Hugging Face cache read from its files (hub names offline)
    "fmt": 0,  # how numbers are printed (no "-0.000")
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
    stages = {
        p.name.removesuffix(".py")
        for p in PKG.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    }
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


@pytest.mark.parametrize(
    "line", ["from ..train import trainer", "from ..train.trainer import train", "from srpo_graph.train import trainer"]
)
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
                found.append(
                    f"srpo_graph/train/{rel}:{lineno}: unranked part of train/ ({own!r} or {other!r}): "
                    "add it to TRAIN_RANK"
                )
            elif TRAIN_RANK[other] >= TRAIN_RANK[own] or (own, other) in NEVER:
                found.append(
                    f"srpo_graph/train/{rel}:{lineno}: train/{own} imports train/{other} ({module}), "
                    f"which is not before it in the loop"
                )
    return found


def test_every_part_of_train_is_ranked():
    parts = {p.name.removesuffix(".py") for p in TRAIN.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts - {"__init__"} <= set(TRAIN_RANK), sorted(parts - {"__init__"} - set(TRAIN_RANK))


def test_train_imports_only_earlier_parts():
    violations = _train_violations()
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize(
    "planted,part",
    [
        ("from srpo_graph.train.trainer import train", "rollout"),
        ("from srpo_graph.train.learn import step", "rollout"),
        ("from srpo_graph.train.observe.record import StepRecord", "config"),
    ],
)
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
    found = [
        f"srpo_graph/eval/{p.name}:{line}: {m}"
        for p in sorted((PKG / "eval").rglob("*.py"))
        for line, m in _imports(p)
        if m.split(".")[0] in heavy or m.startswith(heavy)
    ]
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- (b) no import cycles

# workflow.py draws itself in notebooks through a lazy import of viz (inside a method): the one
# allowed cycle. An edge (a, b) here allows a's imports of b and of every module inside b.
ALLOWED_CYCLE_EDGES = {("srpo_graph.workflow", "srpo_graph.viz")}


def _module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package at ``root`` (its folder): dotted name -> file."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _import_edges(path: Path, module: str, modules: set[str]):
    """(line, imported module) for every import in ``path`` -- module level or inside a function,
    relative ones resolved -- that names a module of ``modules``. ``from pkg import name`` is an
    import of ``pkg.name`` when that is a module, else of ``pkg``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target in modules and target != module:
                yield node.lineno, target


def module_graph(root: Path, package: str) -> nx.DiGraph:
    """The import graph of the package at ``root``: a node per module, an edge per imported module,
    with ``where``: the ``file:line`` of each import statement (relative to ``root``'s parent)."""
    modules = _module_names(root, package)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        edges: dict[str, set[int]] = {}
        for lineno, target in _import_edges(path, module, set(modules)):
            edges.setdefault(target, set()).add(lineno)
        rel = path.relative_to(root.parent).as_posix()
        for target, lines in edges.items():
            graph.add_edge(module, target, where=[f"{rel}:{n}" for n in sorted(lines)])
    return graph


def import_cycles(
    graph: nx.DiGraph, allowed_edges=frozenset(), allowed_cycles=frozenset(), per_component: int = 20
) -> list[list[str]]:
    """The import cycles of ``graph`` (each a list of modules, smallest first), except those
    through an allowed edge and those whose modules are one of ``allowed_cycles``; at most
    ``per_component`` per strongly connected component (their number can explode)."""

    def allowed(a: str, b: str) -> bool:
        return any(a == x and (b == y or b.startswith(y + ".")) for x, y in allowed_edges)

    g = nx.DiGraph([(a, b) for a, b in graph.edges if not allowed(a, b)])
    cycles = []
    for component in nx.strongly_connected_components(g):
        if len(component) < 2:
            continue
        for cycle in itertools.islice(nx.simple_cycles(g.subgraph(component)), per_component):
            if frozenset(cycle) in allowed_cycles:
                continue
            start = cycle.index(min(cycle))
            cycles.append(cycle[start:] + cycle[:start])
    return sorted(cycles)


def describe_cycle(graph: nx.DiGraph, cycle: list[str]) -> str:
    """``a -> b -> a``, then the file:line of every import along it."""
    hops = list(zip(cycle, cycle[1:] + cycle[:1]))
    lines = [" -> ".join([*cycle, cycle[0]])]
    for a, b in hops:
        lines += [f"    {where}: {a} imports {b}" for where in graph.edges[a, b]["where"]]
    return "\n".join(lines)


def test_no_import_cycles():
    """A module that imports a module importing it (even inside a function) does two jobs: cut
    it at its seam (move the shared part into a module both import), never with a lazy import."""
    graph = module_graph(PKG, "srpo_graph")
    cycles = import_cycles(graph, ALLOWED_CYCLE_EDGES)
    assert not cycles, "import cycles:\n" + "\n".join(describe_cycle(graph, c) for c in cycles)


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    # The cycle test must be able to fail: two modules of a fake package importing each other, one
    # of them inside a function and relatively, are found and reported with both lines.
    pkg = tmp_path / "fake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\n\n\ndef f():\n    from fake.sub import b\n    return b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    (pkg / "c.py").write_text("from fake.sub.b import x\nfrom fake import a\n")  # imports both, in no cycle
    graph = module_graph(pkg, "fake")
    assert graph.edges["fake.a", "fake.sub.b"]["where"] == ["fake/a.py:5"]
    assert graph.edges["fake.sub.b", "fake.a"]["where"] == ["fake/sub/b.py:1"]
    cycles = import_cycles(graph)
    assert cycles == [["fake.a", "fake.sub.b"]]
    assert describe_cycle(graph, cycles[0]) == (
        "fake.a -> fake.sub.b -> fake.a\n"
        "    fake/a.py:5: fake.a imports fake.sub.b\n"
        "    fake/sub/b.py:1: fake.sub.b imports fake.a"
    )
    assert import_cycles(graph, allowed_edges={("fake.a", "fake.sub")}) == []  # an allowed edge, by prefix
    assert import_cycles(graph, allowed_cycles={frozenset({"fake.a", "fake.sub.b"})}) == []
