"""Every workflow in workflows/ parses, checks, formats idempotently and round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.lang.checker import check
from srpo_graph.lang.fmt import format_source
from srpo_graph.lang.parser import parse
from srpo_graph.workflow import Workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "workflows").glob("*.wf"))


def _semantic(w: Workflow) -> dict:
    """The workflow without source positions and hash (what formatting must preserve)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("span", "source_hash")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(w.model_dump(mode="json"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"coord_seq", "coord_mixed", "coord_routed", "math_pipeline", "math_mixed", "math_routed", "search"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_checks_and_formats(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    w = load_workflow(path)
    assert w.agents and w.transitions and w.start
    assert all(t.set_sizes for t in w.transitions)
    formatted = format_source(text, str(path))
    assert format_source(formatted) == formatted
    assert formatted == text, "example is not in canonical form: run `srpo-graph fmt --write`"
    again = check(parse(formatted, str(path)), formatted, base_dir=path.parent)
    assert _semantic(again) == _semantic(w)


def test_coordination_set_sizes_cover_1_to_5() -> None:
    sizes = set()
    for p in EXAMPLES:
        if p.stem.startswith("coord"):
            w = load_workflow(p)
            assert {pol.model for pol in w.policies} == {"tiny"}
            for a in w.agents:
                assert a.sampling.max_tokens == 1 and a.sampling.allow
            sizes |= {s for t in w.transitions for s in t.set_sizes}
    assert {1, 2, 3, 4, 5} <= sizes


def test_math_and_search_name_hf_models() -> None:
    for stem in ("math_pipeline", "math_mixed", "math_routed", "search"):
        w = load_workflow(ROOT / "workflows" / f"{stem}.wf")
        assert all("/" in p.model for p in w.policies)


def test_search_routes_back_to_itself_with_a_tool() -> None:
    w = load_workflow(ROOT / "workflows" / "search.wf")
    (step,) = w.transitions
    assert step.max_rounds and step.tools[0].name == "docs" and step.tools[0].call.function == "retrieve"
    assert dict(step.activate.cases) == {"search": ("searcher",), "answer": ("end",)}


def test_formatter_keeps_comments_and_normalizes_layout() -> None:
    messy = (
        '# head\nworkflow   w "d"   import std\npolicy p="tiny" # the model\n'
        'agent a {policy:p prompt:"x{task.t}"  # inline\n output:int}\n'
        "task{t:int}\ntransition t{consume:a activate:end}\nstart:a\n# tail\n"
    )
    out = format_source(messy)
    assert format_source(out) == out
    for c in ("# head", "# the model", "# inline", "# tail"):
        assert c in out
    assert "  prompt: \"x{task.t}\"" in out
    assert _semantic(check(parse(out))) == _semantic(check(parse(messy)))
