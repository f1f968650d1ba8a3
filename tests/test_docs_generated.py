"""Every generated block of docs/ matches the code's tables (regenerate: python scripts/gen_docs.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
gen_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_docs)


@pytest.mark.parametrize("name", list(gen_docs.BLOCKS))
def test_generated_block_is_current(name):
    rel, make = gen_docs.BLOCKS[name]
    text = (ROOT / rel).read_text(encoding="utf-8")
    assert gen_docs.render(text, name, make()) == text, f"{rel}: block {name} is stale; run python scripts/gen_docs.py"


def test_render_replaces_only_the_block():
    text = "a\n<!-- generated: x -->\nold\n<!-- end generated: x -->\nb\n"
    assert gen_docs.render(text, "x", "new") == "a\n<!-- generated: x -->\nnew\n<!-- end generated: x -->\nb\n"
    with pytest.raises(ValueError, match="no block"):
        gen_docs.render("nothing", "x", "new")
