"""docs/std.md is the reference ``srpo_graph.lang.stdref`` generates from ``std``'s code."""

from pathlib import Path

from srpo_graph import std
from srpo_graph.lang.stdref import std_functions, std_reference

ROOT = Path(__file__).resolve().parents[2]


def test_docs_std_reference_is_current():
    # regenerate with: python -m srpo_graph.lang.stdref > docs/std.md
    assert (ROOT / "docs" / "std.md").read_text(encoding="utf-8") == std_reference()


def test_every_public_std_function_is_listed_with_its_missing_value_behaviour():
    ref = std_reference()
    public = {n for n in dir(std) if not n.startswith("_") and callable(getattr(std, n))
              and getattr(getattr(std, n), "__module__", None) == std.__name__}
    assert {n for n, _ in std_functions()} == public
    for name in public:
        row = next(line for line in ref.splitlines() if line.startswith(f"| `{name}` |"))
        assert row.count(" | ") >= 5 and ("None" in row or "empty completion" in row), row
