"""The executor's fast Output record (episode._record_output) equals pydantic's model_construct."""

from __future__ import annotations

from srpo_graph.runtime.episode import _OUTPUT_FIELDS, _record_output
from srpo_graph.runtime.trace import Output


def _fields() -> dict:
    values = dict(id="o0", agent="a", policy="tiny", policy_version=3, step=0, prompt_ids=[1, 2, 3],
                  completion_ids=[4, 5], logprobs=[-0.1, -0.2], temperature=1.0, allowed_token_ids=None,
                  max_tokens=2, activated_by=None, text="45", value=45, finish_reason="length",
                  top_k=0, top_p=1.0, logprob_mode="sampled")
    return {k: v for k, v in values.items() if k in _OUTPUT_FIELDS}


def test_fast_record_equals_model_construct_and_round_trips():
    fields = _fields()
    if set(fields) != _OUTPUT_FIELDS:  # Output grew a field this test does not know: the fallback path
        assert _record_output(**fields) == Output.model_construct(**fields)
        return
    fast, slow = _record_output(**dict(fields)), Output.model_construct(**dict(fields))
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump_json() == slow.model_dump_json()
    assert Output.model_validate_json(fast.model_dump_json()) == Output.model_validate(fields)


def test_missing_field_falls_back_to_model_construct():
    fields = _fields()
    fields.pop("activated_by")
    out = _record_output(**fields)
    assert out == Output.model_construct(**fields)
