"""docs/architecture.md's module map names every module of the package, in its stage (issue 10, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _map() -> dict[str, set[str]]:
    """stage folder ("" for the package root) -> the ``*.py`` names its bullet of the module map mentions."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for bullet in re.split(r"\n- ", section):
        m = re.match(r"`srpo_graph/(\w+)/`", bullet)
        stage = m.group(1) if m else ("" if bullet.startswith("Shared") else None)
        if stage is not None:
            out.setdefault(stage, set()).update(re.findall(r"`(\w+\.py)`", bullet))
    return out


def test_every_module_is_in_the_module_map():
    named = _map()
    missing = []
    for path in sorted((ROOT / "srpo_graph").rglob("*.py")):
        rel = path.relative_to(ROOT / "srpo_graph")
        stage = rel.parent.as_posix() if rel.parent != Path(".") else ""
        if path.name not in named.get(stage, set()):
            missing.append(rel.as_posix())
    assert not missing, f"docs/architecture.md's module map does not mention {missing}"
