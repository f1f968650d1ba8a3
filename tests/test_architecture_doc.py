"""docs/architecture.md's module map names every module of the package, in its package's table
(issue 10, item 7; a table per package with a "change here when…" column, issue 34)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _map() -> dict[str, set[str]]:
    """package folder ("" for the package root) -> the modules its table lists (first column)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for part in section.split("\n### ")[1:]:
        m = re.match(r"`srpo_graph/((?:\w+/)*)`", part)
        assert m, f"a module map heading names no package: {part.splitlines()[0]!r}"
        package = m.group(1).rstrip("/")
        rows = re.findall(r"^\| `(\w+\.py)` \|[^|\n]+\|[^|\n]+\|$", part, re.M)
        out.setdefault(package, set()).update(rows)
    return out


def test_every_module_is_in_the_module_map():
    named = _map()
    missing = []
    for path in sorted((ROOT / "srpo_graph").rglob("*.py")):
        rel = path.relative_to(ROOT / "srpo_graph")
        package = rel.parent.as_posix() if rel.parent != Path(".") else ""
        if path.name not in named.get(package, set()):
            missing.append(rel.as_posix())
    assert not missing, f"docs/architecture.md's module map does not mention {missing}"


def test_the_module_map_names_no_module_that_is_gone():
    named = _map()
    gone = [f"{pkg}/{m}".lstrip("/") for pkg, mods in named.items() for m in mods
            if not (ROOT / "srpo_graph" / pkg / m).is_file()]
    assert not gone, f"docs/architecture.md's module map names modules that do not exist: {gone}"


# Long reasoning is written once as `Note [Name]` and cited by name (STYLE.md). A definition is a
# line that starts with the note (after a comment's `#` or a markdown heading's `#`s) followed by
# `:`, `.` or the end of the line; every other mention is a citation.
_NOTE = re.compile(r"Note \[([^\]]+)\]")
_DEFINITION = re.compile(r"^\s*(?:#+\s*)?Note \[([^\]]+)\]\s*(?:[:.]|$)")
_NOTE_FILES = ("srpo_graph", "docs", "tests", "benchmarks", "scripts", "editors")


def _notes(root: Path = ROOT) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(definitions, citations): note name -> ``file:line`` of each, over the project's code and docs."""
    defs: dict[str, list[str]] = {}
    cites: dict[str, list[str]] = {}
    files = [p for d in _NOTE_FILES for p in sorted((root / d).rglob("*"))
             if p.suffix in (".py", ".md") and "results" not in p.parts and "node_modules" not in p.parts]
    for path in [*files, root / "README.md"]:
        if not path.is_file() or path.resolve() == Path(__file__).resolve():  # this file speaks of notes
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            defined = _DEFINITION.match(line)
            for m in _NOTE.finditer(line):
                where = f"{path.relative_to(root)}:{i}"
                is_def = defined is not None and m.start() == line.index("Note [")
                (defs if is_def else cites).setdefault(m.group(1), []).append(where)
    return defs, cites


def test_every_cited_note_has_exactly_one_definition():
    defs, cites = _notes()
    bad = [f"Note [{n}]: cited at {cites[n][0]}, defined {len(defs.get(n, []))} times {defs.get(n, [])}"
           for n in sorted(cites) if len(defs.get(n, [])) != 1]
    bad += [f"Note [{n}]: defined {len(d)} times {d}" for n, d in sorted(defs.items()) if len(d) > 1]
    assert not bad, "\n".join(bad)


def test_every_note_is_cited_somewhere_else():
    """A note nobody cites is a plain heading, not a note."""
    defs, cites = _notes()
    lonely = [f"Note [{n}] at {d[0]}" for n, d in sorted(defs.items()) if not cites.get(n)]
    assert not lonely, "make these plain headings (nothing cites them):\n" + "\n".join(lonely)


def test_the_note_check_finds_a_dangling_and_a_doubled_note(tmp_path):
    (tmp_path / "srpo_graph").mkdir()
    (tmp_path / "srpo_graph" / "a.py").write_text(
        "# Note [Twice]\n# Note [Twice]: again\nx = 1  # see Note [Twice] and Note [Nowhere]\n# Note [Alone].\n")
    (tmp_path / "README.md").write_text("")
    defs, cites = _notes(tmp_path)
    assert defs == {"Twice": ["srpo_graph/a.py:1", "srpo_graph/a.py:2"], "Alone": ["srpo_graph/a.py:4"]}
    assert cites == {"Twice": ["srpo_graph/a.py:3"], "Nowhere": ["srpo_graph/a.py:3"]}
