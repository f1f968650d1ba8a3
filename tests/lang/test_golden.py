"""Golden files: ok/*.wf -> *.json (the Workflow) and bad/*.wf -> *.err.txt (the exact rendered error).

Regenerate with SRPO_GRAPH_REGEN_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from srpo_graph.errors import SrpoGraphError, WorkflowCheckError, WorkflowSyntaxError
from srpo_graph.lang import load_workflow

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("SRPO_GRAPH_REGEN_GOLDEN") == "1"

# every error class issue 2 lists, with the diagnostic code its golden file must produce
EXPECTED_CODES = {
    "syntax_unexpected_token": "syntax",
    # issue 39, item 7: a tool name per transition, one type (Note [Tool names])
    "tool_types_differ": "type-mismatch",
    "syntax_missing_colon": "syntax",
    "syntax_unclosed_block": "unclosed-block",
    "syntax_bad_string": "bad-string",
    "syntax_bad_escape": "bad-string",
    "syntax_bad_template": "bad-template",
    "not_utf8": "not-utf8",
    "unknown_name": "unknown-name",
    "duplicate_name": "duplicate-name",
    "unknown_field": "unknown-field",
    "not_produced": "not-produced",
    "type_mismatch_ref": "type-mismatch",
    "type_mismatch_call": "type-mismatch",
    "router_non_agent": "router-target",
    "unconsumed_output": "unconsumed",
    "double_consume": "double-consume",
    "unreachable": "unreachable",
    "cannot_reach_end": "no-end",
    "unbounded_cycle": "unbounded-cycle",
    "missing_policy": "missing-policy",
    "bad_import": "bad-import",
    "bad_signature": "bad-signature",
    "bad_signature_module": "bad-signature",
    "many_errors": "unknown-name",
    # issue 12: every analysis bounded, located errors, root causes first
    "duplicate_transition_name": "duplicate-name",
    "deep_nesting": "too-deep",
    "import_system_exit": "bad-import",
    "import_keyboard_interrupt": "bad-import",
    "reserved_literal_names": "reserved-name",
    "duplicate_activation": "duplicate-name",
    "bom": "bom",
    "cr_only_lines": "unknown-name",
    "line_separators": "unknown-name",
    "not_utf8_after_unicode": "not-utf8",
    "malformed_number_exponent": "bad-number",
    "malformed_number_hex": "bad-number",
    "malformed_number_two_points": "bad-number",
    "number_out_of_range": "bad-number",
    "trailing_comma": "syntax",
    "syntax_two_broken_items": "syntax",  # both broken items reported (Note [Syntax error recovery])
    "route_without_subject": "syntax",
    "unclosed_long_string": "bad-string",
    "sample_out_of_range": "bad-value",
    "typo_follow_on": "unknown-name",
    # issue 13: LoRA adapter policies
    "lora_unknown_base": "unknown-name",
    "lora_bad_args": "bad-value",
    "lora_unknown_module": "unknown-module",
    # issue 22: a fix line on every located error, columns, named route mistakes, every error reported
    "duplicate_items": "duplicate-name",
    "duplicate_import_alias": "duplicate-name",
    "keyword_twice": "bad-call",
    "positional_after_keyword": "bad-call",
    "field_of_non_record": "unknown-field",
    "malformed_number_underscore": "bad-number",
    "malformed_number_in_call": "bad-number",
    "unknown_keyword_argument": "bad-signature",
    "too_many_positional": "bad-signature",
    "route_bare": "bad-route",
    "route_as_agent": "bad-route",
    "route_as_agent_after": "bad-route",
    "two_errors_in_one_item": "syntax",
    "bad_templates_in_two_agents": "bad-template",
    "unclosed_before_item_keyword": "unclosed-block",
    "not_utf8_in_prompt": "not-utf8",
    # issue 21: a chat agent on a policy without a chat template
    "chat_without_template": "no-chat-template",
    "chat_on_a_recipe": "no-chat-template",  # tiny-search: known by name, built or not
}


def _compare(path: Path, actual: str) -> None:
    if REGEN or not path.exists():
        if not REGEN:
            pytest.fail(f"missing golden file {path}; run with SRPO_GRAPH_REGEN_GOLDEN=1")
        path.write_text(actual, encoding="utf-8")
    assert actual == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("wf", sorted((GOLDEN / "ok").glob("*.wf")), ids=lambda p: p.stem)
def test_ok(wf: Path, monkeypatch) -> None:
    monkeypatch.chdir(GOLDEN)
    workflow = load_workflow(f"ok/{wf.name}")
    _compare(wf.with_suffix(".json"), workflow.model_dump_json(indent=2) + "\n")


@pytest.mark.parametrize("wf", sorted((GOLDEN / "bad").glob("*.wf")), ids=lambda p: p.stem)
def test_bad(wf: Path, monkeypatch) -> None:
    monkeypatch.chdir(GOLDEN)
    with pytest.raises(SrpoGraphError) as info:
        load_workflow(f"bad/{wf.name}")
    assert isinstance(info.value, (WorkflowSyntaxError, WorkflowCheckError))
    assert info.value.exit_code == 2
    codes = {d.code for d in info.value.diagnostics}
    assert EXPECTED_CODES[wf.stem] in codes, codes
    _compare(wf.with_suffix(".err.txt"), str(info.value) + "\n")


def test_every_error_class_has_a_golden_file() -> None:
    stems = {p.stem for p in (GOLDEN / "bad").glob("*.wf")}
    assert set(EXPECTED_CODES) == stems


def test_many_errors_are_capped() -> None:
    text = (GOLDEN / "bad" / "many_errors.err.txt").read_text()
    assert text.rstrip().splitlines()[-1].startswith("... and ")
    assert text.count(": error: ") == 20
