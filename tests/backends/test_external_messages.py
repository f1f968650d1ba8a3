"""An external agent's `system:` is its request's system message, and the messages it was sent are in
the trace and in `show` (issue 39, item 4). A real local HTTP endpoint (test_openai_backend._Server,
echo mode) records what arrives; the tiny model samples the trained agent."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import check, parse
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import read_traces, write_traces
from tests.backends.test_openai_backend import _Server  # its real local HTTP server

WF = """workflow ext
import std
task {{ target: int }}
policy solver = "tiny"
policy judge = openai("{url}", model="default", timeout=30, retries=0, concurrency=4)
agent s {{ policy: solver prompt: "<a>{{task.target}}" sample {{ max_tokens: 1, allow: ["1", "2", "3"] }}
  output: int via std.digit }}
agent v {{ policy: judge {chat}prompt: "Check {{s}} for {{task.target}}." sample {{ max_tokens: 3 }} output: text }}
transition propose {{ consume: s activate: v }}
transition verify {{ consume: v activate: end }}
start: s
reward: std.digits_sum_to(task.target, s, s)
"""
TASKS = [Task(id=f"t{i}", fields={"id": f"t{i}", "target": i + 4}) for i in range(2)]


def test_system_is_sent_first_recorded_and_shown(tiny_backend, tmp_path):
    from srpo_graph.backends.openai import OpenAIBackend

    server = _Server("echo")
    try:
        wf = check(parse(WF.format(url=server.url, chat='system: "You verify sums; target {task.target}." '),
                         "ext.wf"))
        judge = OpenAIBackend(wf.policy_by_name["judge"].external)
        try:
            res = run(wf, TASKS, {"solver": tiny_backend, "judge": judge}, samples=2, seed=0)
        finally:
            judge.close()
    finally:
        server.stop()
    sent = [body["messages"] for body, _ in server.calls]
    assert len(sent) == 4
    recorded = []
    for ep in res.episodes:
        s, v = ep.outputs
        target = ep.task_id[1:]
        expect = [{"role": "system", "content": f"You verify sums; target {int(target) + 4}."},
                  {"role": "user", "content": f"Check {s.value} for {int(target) + 4}."}]
        assert [m.model_dump() for m in v.messages] == expect and s.messages is None
        recorded.append(expect)
    assert sorted(map(json.dumps, sent)) == sorted(map(json.dumps, recorded))  # recorded = what arrived
    traces = tmp_path / "t.jsonl"
    write_traces(traces, res.episodes)
    assert read_traces(traces)[0].outputs[1].messages == res.episodes[0].outputs[1].messages  # round trip
    shown = CliRunner().invoke(app, ["show", str(traces), "--episode", "0"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "   system │ You verify sums; target 4." in shown.output
    assert "     user │ Check" in shown.output
    assert "no local tokenizer for judge" not in shown.output


def test_without_system_one_user_message(tiny_backend):
    from srpo_graph.backends.openai import OpenAIBackend

    server = _Server("echo")
    try:
        wf = check(parse(WF.format(url=server.url, chat=""), "ext.wf"))
        judge = OpenAIBackend(wf.policy_by_name["judge"].external)
        try:
            res = run(wf, TASKS[:1], {"solver": tiny_backend, "judge": judge}, samples=1, seed=0)
        finally:
            judge.close()
    finally:
        server.stop()
    assert [m["role"] for m in server.calls[0][0]["messages"]] == ["user"]
    assert [m.role for m in res.episodes[0].outputs[1].messages] == ["user"]


@pytest.mark.parametrize("item", ["memory: chat ", "think: strip "])
def test_token_level_chat_items_on_an_endpoint_are_refused(item):
    with pytest.raises(WorkflowCheckError, match=f"sets `{item.split()[0]}` on policy 'judge'"):
        check(parse(WF.format(url="http://127.0.0.1:9/v1", chat=item), "ext.wf"))


def test_a_token_output_cannot_carry_messages():
    """The trace rules refuse `messages` on a token output (Note [One copy of the trace rules])."""
    from srpo_graph.runtime.trace import Output

    line = {"id": "o0", "agent": "s", "policy": "solver", "step": 0, "prompt_ids": [1], "completion_ids": [2],
            "logprobs": [-0.5], "text": "x", "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(ValueError, match="only a text-only output"):
        Output.model_validate(line)
