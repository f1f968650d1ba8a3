"""`policy p = lora("base", ...)` in the language (issue 13): parse, check, format, summarize, draw."""

from __future__ import annotations

from pathlib import Path

from srpo_graph.lang import ast, check, parse
from srpo_graph.lang.fmt import format_source
from srpo_graph.lang.summary import summary
from srpo_graph.viz.text import to_dot, to_mermaid
from srpo_graph.workflow import LoraAdapter

ROOT = Path(__file__).resolve().parents[2]
SRC = """workflow w
import std
task { target: int }
policy base = "tiny"
policy solver = lora("base", r=16, alpha=32, targets=[q_proj, v_proj])
policy checker = lora("base", r=4, alpha=0.5, dropout=0.1, targets=[gate_proj,],)
agent a { policy: solver prompt: "<a>{task.target}" output: int via std.digit }
agent b { policy: checker prompt: "<b>{task.target}" output: int via std.digit }
agent c { policy: base prompt: "<c>{task.target}" output: int via std.digit }
transition t { consume: a, b, c activate: end }
start: a, b, c
"""


def _strip(node):
    """The AST without spans (what a round trip must keep)."""
    if isinstance(node, tuple):
        return tuple(_strip(x) for x in node)
    if hasattr(node, "__dataclass_fields__"):
        return (type(node).__name__,) + tuple(_strip(getattr(node, f)) for f in node.__dataclass_fields__
                                              if f not in ("span", "comments", "source"))
    return node


def test_lora_parses_into_frozen_nodes_with_spans():
    m = parse(SRC)
    decl = m.items[3]
    assert isinstance(decl, ast.PolicyDecl) and isinstance(decl.model, ast.LoraExpr)
    assert decl.model.base.value == "base" and decl.model.span.line == 5
    assert [a.key.value for a in decl.model.args] == ["r", "alpha", "targets"]
    assert [n.value for n in decl.model.args[2].value.names] == ["q_proj", "v_proj"]


def test_check_fills_the_adapter_and_the_base_model():
    w = check(parse(SRC), SRC)
    pol = w.policy_by_name
    assert pol["solver"].adapter == LoraAdapter(base="base", r=16, alpha=32.0, targets=("q_proj", "v_proj"))
    assert pol["checker"].adapter.dropout == 0.1 and pol["checker"].model == "tiny"
    assert pol["base"].adapter is None and w.frozen_bases == {"base"}
    defaults = check(parse(SRC.replace('lora("base", r=16, alpha=32, targets=[q_proj, v_proj])', 'lora("base")')), SRC)
    assert defaults.policy_by_name["solver"].adapter == LoraAdapter(base="base")


def test_format_round_trips():
    out = format_source(SRC)
    assert 'policy solver = lora("base", r=16, alpha=32, targets=[q_proj, v_proj])' in out
    assert 'policy checker = lora("base", r=4, alpha=0.5, dropout=0.1, targets=[gate_proj])' in out
    assert format_source(out) == out
    assert _strip(parse(out).items) == _strip(parse(SRC).items)
    example = (ROOT / "workflows" / "coord_lora2.wf").read_text()
    assert format_source(example) == example


def test_summary_and_pictures_show_the_shared_base():
    w = check(parse(SRC), SRC)
    text = summary(w)
    assert 'solver = lora("base", r=16, alpha=32, targets=[q_proj, v_proj])' in text
    assert ('adapters:    base "tiny" loaded once: c [base] sample the frozen base; a train adapter solver (r=16); '
            "b train adapter checker (r=4)") in text
    dot = to_dot(w)
    assert "solver: lora r=16 on base" in dot and "base (frozen)" in dot
    assert "checker: lora r=4 on base" in to_mermaid(w)
