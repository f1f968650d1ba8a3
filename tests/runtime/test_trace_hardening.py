"""Damaged and hostile trace files (issue 12, item 9): every one is a TraceError naming
``file:line`` (and the field), never a traceback; numbers are never coerced from strings; and
``show`` accepts exactly the files ``compile`` accepts.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.errors import TraceError
from srpo_graph.runtime.trace import MAX_DEPTH, parse_episode_line, read_trace_set, read_traces


def _good() -> list[dict]:
    return [json.loads(ep.to_json()) for ep in synthetic_episodes(1, 2, seed=4)]


def _set(*path, value):
    def mutate(ep):
        obj = ep
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


def _nest(depth: int):
    v: object = 1
    for _ in range(depth):
        v = [v]
    return v


BAD_FIELDS = {  # mutation of line 2 -> what the message must say
    "numeric string for a float": (_set("reward", value="1.0"), "field reward: Input should be a valid number"),
    "numeric string for an int": (
        _set("outputs", 0, "step", value="0"),
        "field outputs.0.step: Input should be a valid integer",
    ),
    "bool for an int": (_set("sample", value=True), "field sample: Input should be a valid integer"),
    "numeric string token id": (_set("outputs", 0, "prompt_ids", value=["5"]), "field outputs.0.prompt_ids.0"),
    "token id 2^63": (
        _set("outputs", 0, "completion_ids", 0, value=2**63),
        "field outputs.0.completion_ids.0: Input should be less than",
    ),
    "token id 2^64 + 1": (_set("outputs", 0, "prompt_ids", 0, value=2**64 + 1), "field outputs.0.prompt_ids.0"),
    "negative token id": (_set("outputs", 0, "prompt_ids", 0, value=-1), "greater than or equal to 0"),
    "seed 2^63": (_set("seed", value=2**63), "field seed"),
    "NaN reward": (_set("reward", value=float("nan")), "field reward: Input should be a finite number"),
    "inf transition reward": (_set("transitions", 0, "reward", value=float("-inf")), "field transitions.0.reward"),
    "absurd reward": (_set("reward", value=1e300), "field reward: Input should be less than or equal to 1000000000"),
    "absurd transition reward": (_set("transitions", 0, "reward", value=-1e12), "field transitions.0.reward"),
    "NaN temperature": (_set("outputs", 0, "temperature", value=float("nan")), "field outputs.0.temperature"),
    "negative temperature": (_set("outputs", 0, "temperature", value=-1.0), "field outputs.0.temperature"),
    "log-prob past float32": (
        _set("outputs", 0, "logprobs", 0, value=-1e39),
        "logprobs[0] = -1e+39 is not a finite log-probability (below float32's range",
    ),
    "temperature past float32": (_set("outputs", 0, "temperature", value=1e39), "outside float32's normal range"),
    "temperature under float32": (_set("outputs", 0, "temperature", value=1e-40), "outside float32's normal range"),
    "top_p under float32": (_set("outputs", 0, "top_p", value=1e-46), "top_p 1e-46 rounds to 0 in float32"),
    "empty allowed set": (_set("outputs", 0, "allowed_token_ids", value=[]), "allowed_token_ids is empty"),
    "token outside the allowed set": (
        _set("outputs", 0, "allowed_token_ids", value=[31]),
        "are outside its allowed_token_ids",
    ),
    "more tokens than max_tokens": (_set("outputs", 0, "max_tokens", value=1), "completion tokens for max_tokens 1"),
    "duplicate transition id": (
        lambda ep: ep["transitions"].append(dict(ep["transitions"][0], consumed=[])),
        "field transitions[1].id: duplicate transition id",
    ),
    "output consumed twice": (
        lambda ep: ep["transitions"].append(dict(ep["transitions"][0], id="tX")),
        "is consumed by both",
    ),
    "output consumed and superseded": (
        lambda ep: ep["transitions"][-1].update(superseded=[ep["transitions"][0]["consumed"][0]]),
        "is superseded by",
    ),
    "deep value": (_set("outputs", 0, "value", value=_nest(MAX_DEPTH + 5)), "field outputs[0].value"),
    "deep tool result": (
        _set("transitions", 0, "tool_results", value={"r": _nest(MAX_DEPTH + 5)}),
        "nested deeper than",
    ),
}

BAD_LINES = {  # the raw second line -> what the message must say
    "not UTF-8": (b'{"schema": "\xff\xfe"}', ":2:13: error: not UTF-8 text (byte 0xff)"),
    "Latin-1 text": ('{"schema": "caf\u00e9"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9)"),
    "binary junk": (bytes(range(256)), "not UTF-8 text"),
    "NUL bytes": (b"\x00" * 64, ":2:1: error: not valid JSON"),
    "nesting deeper than the stack": (b"[" * 200_000 + b"]" * 200_000, "nested deeper than"),
    "an integer of 5000 digits": (
        b'{"schema": ' + b"9" * 5000 + b"}",
        "not valid JSON here: an integer with 5000 digits (at most 100)",
    ),
    "a JSON array": (b"[1, 2]", "an episode must be a JSON object"),
}

BAD_SETS = {  # batch rules: compile refuses them, so show does too
    "another workflow": (_set("workflow", "name", value="other"), "field workflow.name"),
    "a changed workflow": (_set("workflow", "hash", value="f" * 64), "field workflow.hash"),
    "a sample twice": (_set("sample", value=0), "field sample: group"),
}


def _file(tmp_path, second: bytes) -> str:
    path = tmp_path / "t.jsonl"
    path.write_bytes(json.dumps(_good()[0]).encode() + b"\n" + second + b"\n")
    return str(path)


def _mutated(tmp_path, mutate) -> str:
    bad = _good()[1]
    mutate(bad)
    return _file(tmp_path, json.dumps(bad).encode())


@pytest.mark.parametrize("kind", sorted(BAD_FIELDS))
def test_a_bad_field_names_file_line_and_field(tmp_path, kind):
    mutate, message = BAD_FIELDS[kind]
    path = _mutated(tmp_path, mutate)
    with pytest.raises(TraceError) as info:
        read_traces(path)
    assert str(info.value).startswith(f"{path}:2") and message in str(info.value), str(info.value)
    assert len(read_traces(path, skip_bad=True)) == 1  # the good line is never lost to the bad one


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_a_broken_line_names_file_and_line(tmp_path, kind):
    raw, message = BAD_LINES[kind]
    path = _file(tmp_path, raw.replace(b"\n", b" "))
    with pytest.raises(TraceError) as info:
        read_traces(path)
    assert str(info.value).startswith(f"{path}:2") and message in str(info.value), str(info.value)
    errors: list = []
    assert len(read_traces(path, skip_bad=True, errors=errors)) == 1 and len(errors) == 1


def _float_fields() -> list[tuple[str, ...]]:
    """Every float the trace models hold, as a path into an episode's JSON (``*``: any element)."""
    from typing import get_args

    from pydantic import BaseModel

    from srpo_graph.runtime.trace import Episode

    def floats(model, prefix):
        for name, info in model.model_fields.items():
            key = info.alias or name
            ann = info.annotation
            args = [a for a in (ann, *get_args(ann), *(x for g in get_args(ann) for x in get_args(g)))]
            if float in args or any(get_args(a) and get_args(a)[0] is float for a in args):
                yield (*prefix, key, *(("*",) if str(ann).startswith("list") else ()))
            for a in args:
                if isinstance(a, type) and issubclass(a, BaseModel):
                    yield from floats(a, (*prefix, key, "*") if str(ann).startswith("list") else (*prefix, key))

    return sorted(set(floats(Episode, ())))


def _plant(ep: dict, path: tuple[str, ...], value: float) -> None:
    obj: object = ep
    for k in path[:-1]:
        obj = obj[0] if k == "*" else obj[k]  # type: ignore[index]
    if path[-1] == "*":
        obj[0] = value  # type: ignore[index]
    else:
        obj[path[-1]] = value  # type: ignore[index]


def test_the_float_fields_are_all_found():
    found = {".".join(p) for p in _float_fields()}
    assert {"reward", "outputs.*.logprobs.*", "outputs.*.temperature", "outputs.*.top_p",
            "transitions.*.reward"} <= found, found


@pytest.mark.parametrize("value", [1e39, -1e39, 1e-40])
@pytest.mark.parametrize("field", [".".join(p) for p in _float_fields()])
def test_every_float_field_is_what_float32_will_hold(tmp_path, field, value):
    """The rule, over every float of the trace models (the compiler builds float32 tensors): a value
    past float32's range is refused naming file:line and the field, and a positive one too small to
    stay a normal float32 is refused where it is a scale (temperature, top_p); rewards may round to 0."""
    bad = _good()[1]
    _plant(bad, tuple(field.split(".")), value)
    path = _file(tmp_path, json.dumps(bad).encode())
    scale = field.endswith(("temperature", "top_p"))
    if value == 1e-40 and not scale:  # a reward or log-prob of 1e-40 is ~0 in float32: no harm
        assert len(read_traces(path)) == 2
        return
    with pytest.raises(TraceError) as info:
        read_traces(path)
    head = field.split(".")[0]
    assert str(info.value).startswith(f"{path}:2") and f"field {head}" in str(info.value), str(info.value)


def test_a_binary_file_is_an_error_of_its_first_line(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(128, 256)) * 64)
    with pytest.raises(TraceError, match=rf"^{path}:1:1: error: not UTF-8 text \(byte 0x80\)"):
        read_traces(path)


def test_numbers_are_read_as_numbers_not_coerced():
    line = json.dumps(_good()[0])
    assert parse_episode_line(line).reward == json.loads(line)["reward"]
    as_int = json.loads(line)
    as_int["reward"] = 1  # an integer reward is a number: accepted as 1.0
    assert parse_episode_line(json.dumps(as_int)).reward == 1.0


ALL = (
    [("field", k, lambda tp, m=m: _mutated(tp, m)) for k, (m, _) in BAD_FIELDS.items()]
    + [("line", k, lambda tp, r=r: _file(tp, r.replace(b"\n", b" "))) for k, (r, _) in BAD_LINES.items()]
    + [("set", k, lambda tp, m=m: _mutated(tp, m)) for k, (m, _) in BAD_SETS.items()]
)


@pytest.mark.parametrize("group, kind, make", ALL, ids=[f"{g}:{k}" for g, k, _ in ALL])
def test_show_rejects_exactly_what_compile_rejects(tmp_path, group, kind, make):
    path = make(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(app, ["show", path])
    compiled = runner.invoke(app, ["compile", path, "-o", str(tmp_path / "b.safetensors")])
    assert compiled.exit_code != 0 and shown.exit_code != 0, (shown.output, compiled.output)
    for r in (shown, compiled):
        assert f"{path}:2" in r.output, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), r.output
        assert "Traceback" not in r.output
    if group == "set":
        with pytest.raises(TraceError, match=BAD_SETS[kind][1]):
            read_trace_set(path)


def test_show_and_compile_accept_a_good_file(tmp_path):
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps(ep) + "\n" for ep in _good()))
    runner = CliRunner()
    assert runner.invoke(app, ["show", str(path)]).exit_code == 0
    assert runner.invoke(app, ["compile", str(path), "-o", str(tmp_path / "b.safetensors")]).exit_code == 0


def test_an_absurd_reward_fails_its_episode_instead_of_the_run(tiny_backend, tmp_path):
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task

    (tmp_path / "huge_rewards.py").write_text("def huge(x: int) -> float:\n    return 1e12\n")
    wf_path = tmp_path / "w.wf"
    wf_path.write_text(
        'workflow w\nimport std\nimport huge_rewards as h\ntask { target: int }\npolicy tiny = "tiny"\n'
        'agent a { policy: tiny prompt: "<a>{task.target}" sample { max_tokens: 1 } output: int via std.digit }\n'
        "transition t { consume: a reward: h.huge(a) activate: end }\nstart: a\n"
    )
    res = run(load_workflow(wf_path), [Task(id="t0", fields={"target": 1})], {"tiny": tiny_backend}, samples=2)
    assert [e.status for e in res.episodes] == ["failed", "failed"]
    assert all("returned 1000000000000.0" in e.error for e in res.episodes)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(e.to_json() + "\n" for e in res.episodes))
    assert len(read_traces(path)) == 2  # what was written reads back
