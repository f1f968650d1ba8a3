"""``srpo-graph compile`` and ``srpo-graph inspect`` on real files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.runtime.trace import write_traces


@pytest.mark.proc
def test_compile_then_inspect_subprocess(tmp_path):
    traces = tmp_path / "t.jsonl"
    write_traces(traces, synthetic_episodes(2, 3, seed=1))
    out = tmp_path / "b.safetensors"
    r = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "compile", str(traces), "-o", str(out),
                        "--micro-batch-tokens", "64"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    b = SetBatch.load(out)
    assert b.num_micro_batches > 1 and "events" in r.stdout
    r = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "inspect", str(out), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["events"] == b.num_sets and sum(summary["set_size_histogram"].values()) == b.num_sets
    assert 0 < summary["real_token_share_padded"] < 1


def test_bad_line_is_reported_with_file_and_line(tmp_path):
    traces = tmp_path / "t.jsonl"
    eps = synthetic_episodes(1, 2, seed=2)
    write_traces(traces, eps)
    bad = json.loads(eps[0].to_json())
    bad["outputs"][0]["logprobs"] = bad["outputs"][0]["logprobs"] + [-1.0]
    with traces.open("a") as fh:
        fh.write(json.dumps(bad) + "\n")
    runner = CliRunner()
    r = runner.invoke(app, ["compile", str(traces), "-o", str(tmp_path / "b.safetensors")])
    assert r.exit_code == 4  # TraceError
    assert f"{traces}:3" in r.output and "outputs.0" in r.output
    r = runner.invoke(app, ["compile", str(traces), "-o", str(tmp_path / "b.safetensors"), "--skip-bad"])
    assert r.exit_code == 0, r.output
    assert SetBatch.load(tmp_path / "b.safetensors").stats.skipped_bad_lines == 1


def test_inspect_table_and_bad_file(tmp_path):
    traces = tmp_path / "t.jsonl"
    write_traces(traces, synthetic_episodes(2, 2, seed=3))
    runner = CliRunner()
    assert runner.invoke(app, ["compile", str(traces), "-o", str(tmp_path / "b.safetensors")]).exit_code == 0
    r = runner.invoke(app, ["inspect", str(tmp_path / "b.safetensors")])
    assert r.exit_code == 0 and "set sizes" in r.output and "dropped incomplete events" in r.output
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    r = runner.invoke(app, ["inspect", str(tmp_path / "junk.safetensors")])
    assert r.exit_code == 6 and "not a readable safetensors file" in r.output


def _set(path, value):
    def mutate(ep):
        obj = ep
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


BAD = [  # (mutation of the second episode, exit code, field named in the message)
    (_set(["schema"], "srpo-graph.trace/9"), 4, "schema"),
    (_set(["outputs", 0, "logprobs"], [float("nan")]), 4, "outputs.0"),
    (_set(["outputs", 0, "logprobs"], [-1.0] * 40), 4, "outputs.0"),
    (
        _set(["transitions", 0, "consumed"], ["nope"]),
        4,
        "field transitions[0].consumed: transition 't0' consumes unknown output ids",
    ),
    (_set(["sample"], 0), 6, "field sample"),
    (_set(["workflow", "name"], "other"), 6, "field workflow.name"),
    (_set(["workflow", "hash"], "f" * 64), 6, "field workflow.hash"),
    (_set(["transitions", 0, "reward"], float("inf")), 4, "field transitions.0.reward"),  # the trace schema's rule
]


def test_bad_traces_name_line_and_field_without_traceback(tmp_path):
    runner = CliRunner()
    for i, (mutate, code, field) in enumerate(BAD):
        eps = synthetic_episodes(1, 2, seed=4)
        bad = json.loads(eps[1].to_json())
        mutate(bad)
        traces = tmp_path / f"bad{i}.jsonl"
        traces.write_text(eps[0].to_json() + "\n" + json.dumps(bad) + "\n")
        r = runner.invoke(app, ["compile", str(traces), "-o", str(tmp_path / "b.safetensors")])
        assert r.exit_code == code, (i, r.output)
        assert f"{traces}:2" in r.output and field in r.output and "Traceback" not in r.output, (i, r.output)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    r = runner.invoke(app, ["compile", str(empty), "-o", str(tmp_path / "b.safetensors")])
    assert r.exit_code == 4 and "no episodes" in r.output


def test_every_compile_option_is_a_cli_option_that_reaches_the_config(tmp_path):
    """The options are generated from CompileConfig's fields: each one changes the batch as the config would."""
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.compiler.options import CompileConfig as Fields

    traces = tmp_path / "t.jsonl"
    eps = synthetic_episodes(3, 4, seed=5)
    write_traces(traces, eps)
    args = [
        "--advantage",
        "agent",
        "--returns",
        "episode",
        "--grouping",
        "turn",
        "--singleton-baseline",
        "episode",
        "--no-std",
        "--gamma",
        "0.5",
        "--failed",
        "zero",
        "--truncated",
        "penalize",
        "--micro-batch-tokens",
        "0",
    ]
    r = CliRunner().invoke(app, ["compile", str(traces), "-o", str(tmp_path / "b.safetensors"), *args])
    assert r.exit_code == 0, r.output
    got = SetBatch.load(tmp_path / "b.safetensors")
    want = compile(
        eps,
        CompileConfig(
            advantage="agent",
            returns="episode",
            grouping="turn",
            singleton_baseline="episode",
            use_std=False,
            gamma=0.5,
            failed="zero",
            truncated="penalize",
            micro_batch_tokens=0,
        ),
    )
    assert got.member_advantage.tolist() == want.member_advantage.tolist()
    help_text = CliRunner().invoke(app, ["compile", "--help"]).output
    for name in Fields.model_fields:
        if name not in ("policies", "use_std"):
            assert f"--{name.replace('_', '-')}" in help_text
    bad = CliRunner().invoke(app, ["compile", str(traces), "-o", str(tmp_path / "c.safetensors"), "--gamma", "2"])
    assert bad.exit_code != 0 and "gamma" in bad.output
