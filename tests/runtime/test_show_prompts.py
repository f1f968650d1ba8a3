"""``srpo-graph show`` prints each output's prompt, decoded from the recorded ids (terminal and HTML).

A real run of a workflow whose second agent's prompt has an optional hole ``{a?}``: the shown
prompt must equal the template filled in by hand from the trace (the value of ``a``), and
``--no-prompt`` hides it. A trace in a run folder (``RUN/traces/``) finds its tokenizer through
the run's ``workflow.json`` without any flag.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.runtime.trace import read_traces

WF = '''workflow holes
import std
task { target: int }
policy tiny = "tiny"
agent a {
  policy: tiny
  prompt: "<a>{task.target}"
  sample { max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"] }
  output: int via std.digit
}
agent b {
  policy: tiny
  prompt: "<b>{task.target}<sep>{a?}"
  sample { max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"] }
  output: int via std.digit
}
transition hand_off { consume: a  activate: b }
transition score { consume: b  activate: end }
start: a
reward: std.digits_sum_to(task.target, a, b)
'''


def _run(tmp_path: Path) -> tuple[Path, Path, list]:
    wf = tmp_path / "holes.wf"
    wf.write_text(WF)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "target": i + 3}) + "\n" for i in range(2)))
    out = tmp_path / "tr.jsonl"
    res = CliRunner().invoke(
        app, ["run", str(wf), "--tasks", str(tasks), "--samples", "2", "--out", str(out), "--quiet"]
    )
    assert res.exit_code == 0, res.output
    return wf, out, read_traces(out)


def _expected(ep) -> dict[str, str]:
    """Each output's prompt, filled in by hand from the template and the trace's values (after the
    tiny tokenizer's ``<bos>``: the prompt as the model saw it)."""
    target = {"t0": 3, "t1": 4}[ep.task_id]
    a = next(o for o in ep.outputs if o.agent == "a")
    a_text = "" if a.value is None else str(a.value)
    return {"a": f"<bos><a>{target}", "b": f"<bos><b>{target}<sep>{a_text}"}


def test_show_prints_the_decoded_prompt_and_hides_it_on_request(tmp_path):
    wf, out, episodes = _run(tmp_path)
    ep = episodes[1]
    expect = _expected(ep)
    res = CliRunner().invoke(
        app,
        ["show", str(out), "--episode", "1", "--workflow", str(wf), "--html", str(tmp_path / "e.html")],
        terminal_width=200,
    )
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if "prompt │" in line]
    shown = [line.split("prompt │", 1)[1].strip(" │") for line in lines]
    assert shown == [expect[o.agent] for o in ep.outputs], (shown, res.output)
    page = (tmp_path / "e.html").read_text()
    assert page.count("<summary>prompt</summary>") == len(ep.outputs)
    assert f"<code>{expect['b'].replace('<', '&lt;').replace('>', '&gt;')}</code>" in page
    hidden = CliRunner().invoke(
        app,
        ["show", str(out), "--episode", "1", "--workflow", str(wf), "--no-prompt", "--html", str(tmp_path / "h.html")],
        terminal_width=200,
    )
    assert hidden.exit_code == 0 and "prompt │" not in hidden.output
    assert "<summary>prompt</summary>" not in (tmp_path / "h.html").read_text()


def test_without_a_tokenizer_the_prompt_is_a_count_and_the_fix_is_named(tmp_path):
    _, out, episodes = _run(tmp_path)
    res = CliRunner().invoke(app, ["show", str(out), "--episode", "0"], terminal_width=200)
    assert res.exit_code == 0 and "prompt │" not in res.output
    assert "no local tokenizer" in res.output and "--workflow WF or --model" in res.output
    res = CliRunner().invoke(app, ["show", str(out), "--episode", "0", "--model", "tiny"], terminal_width=200)
    assert f"prompt │ {_expected(episodes[0])['a']}" in res.output


def test_a_trace_in_a_run_folder_finds_its_workflow(tmp_path):
    from srpo_graph.lang import load_workflow
    from srpo_graph.train.run_folder import record_workflow

    wf, out, episodes = _run(tmp_path)
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    shutil.copy(out, run / "traces" / "step_1.jsonl")
    record_workflow(run, load_workflow(wf), wf)
    res = CliRunner().invoke(app, ["show", str(run / "traces" / "step_1.jsonl"), "--episode", "0"], terminal_width=200)
    assert res.exit_code == 0 and f"prompt │ {_expected(episodes[0])['b']}" in res.output, res.output


def test_trace_text_prints_as_written(tmp_path):
    """Issue 39, item 7: a trailing backslash printed twice (markup escaping). Every trace text
    (output, value, agent, tool result, error) is printed as written, never read as markup."""
    from rich.console import Console

    from srpo_graph.runtime.show import print_episode

    _, _, episodes = _run(tmp_path)
    ep = episodes[0]
    odd = ["ends in \\", "[bold]not bold[/]", "a \\[b] c\\\\"]
    outs = [o.model_copy(update={"text": odd[i % 3], "value": odd[(i + 1) % 3]}) for i, o in enumerate(ep.outputs)]
    trs = [t.model_copy(update={"tool_results": {"t": odd[2]}}) for t in ep.transitions]
    ep = ep.model_copy(update={"outputs": outs, "transitions": trs, "error": odd[0]})
    console = Console(record=True, width=300)
    print_episode(console, ep, 0, None)
    shown = console.export_text()
    for text in odd:
        assert text in shown, (text, shown)
    assert "ends in \\\\" not in shown and "[bold]not bold[/]" in shown
