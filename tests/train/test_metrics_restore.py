"""No step silently missing from metrics.jsonl after a resume (issue 40 item 8; Note [No step missing
from metrics.jsonl], ``train/observe/metrics.py``): a damaged line of a step up to the checkpoint is
moved aside and the step written again from what the checkpoint kept (reward, eval/reward), marked
``metrics_lost``; a step after it is run again and rewritten; the user is told in one line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import LOST, MetricsWriter, checkpoint_records, read_metrics, truncate_after
from srpo_graph.train.observe.plots import draw_plots
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
JUNK = b"\x00\xff\xfe garbage \x93"


def _damage(path: Path) -> None:
    """Junk bytes over the middle line, the last line cut as by a kill mid-write."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][:5] + JUNK + lines[1][5 + len(JUNK):]
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
    path.write_bytes(b"".join(lines))


def test_a_damaged_step_before_the_checkpoint_is_restored_and_said_in_one_line(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for step in range(1, 5):
            w.log({"step": step, "reward": step / 10, "loss/ratio_max": 1.0 + step})
    path = tmp_path / "metrics.jsonl"
    _damage(path)  # step 2 damaged, step 4 cut off
    said = io.StringIO()
    notes = truncate_after(path, 3, warn=said, restore=checkpoint_records(3, [0.1, 0.2, 0.3], [(2, 0.9)]))
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 4 is after the checkpoint: the rerun writes it
    assert rows[1]["reward"] == 0.2 and rows[1]["eval/reward"] == 0.9 and "loss/ratio_max" not in rows[1]
    assert "damaged or missing" in rows[1][LOST] and LOST not in rows[0] and LOST not in rows[2]
    assert len(notes) == 1 and f"{path}:2:" in notes[0]
    assert JUNK in (tmp_path / "metrics.jsonl.damaged").read_bytes()  # the line as it was
    line = said.getvalue()
    assert line.count("\n") == 1 and "1 damaged line(s) moved to" in line, line
    assert f'step(s) 2 written again from the checkpoint with reward and eval/reward only, marked "{LOST}"' in line
    assert "steps after 3 are run again" in line
    assert {p.name for p in draw_plots(tmp_path)} >= {"reward.png"}  # a reader copes with the partial record
    # a step up to the checkpoint with no line at all (deleted by hand, the file gone) is restored too
    path.unlink()
    truncate_after(path, 2, warn=io.StringIO(), restore=checkpoint_records(2, [0.1, 0.2], []))
    assert [(r["step"], r["reward"], LOST in r) for r in read_metrics(path)] == [(1, 0.1, True), (2, 0.2, True)]


@pytest.mark.slow
def test_a_resumed_run_rewrites_every_step_of_a_damaged_metrics_file(tmp_path, capsys):
    """A real run stopped after step 3 (checkpoint at 2): junk bytes in step 2's line, step 3's cut off;
    ``--resume`` to step 4 leaves a line for every step: 2 restored from the checkpoint and marked,
    3 and 4 trained again, equal to an uninterrupted run's."""
    def config(run: Path, **over) -> object:
        return validate({"run_dir": str(run), "steps": 4, "seed": 3, **over,
                         "rollout": {"tasks_per_step": 2, "samples": 2,
                                     "tasks": str(ROOT / "workflows" / "tasks" / "coord.jsonl")},
                         "checkpoint": {"every": 2}, "eval": {"every": 0},
                         "logging": {"tensorboard": False, "plots": False, "progress": False}})

    wf = ROOT / "workflows" / "coord_par2.wf"
    train(wf, config(tmp_path / "whole"))
    run = tmp_path / "run"
    train(wf, config(run, debug={"stop_after_step": 3}))
    _damage(run / "metrics.jsonl")
    capsys.readouterr()
    train(wf, config(run), resume=True)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "metrics.jsonl:" in ln]
    assert len(said) == 1 and "step(s) 2 written again from the checkpoint" in said[0], said
    whole, got = read_metrics(tmp_path / "whole" / "metrics.jsonl"), read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert LOST in got[1] and got[1]["reward"] == whole[1]["reward"]
    keep = ("reward", "loss/ratio_max", "updates")
    for want, row in zip(whole[2:], got[2:]):
        assert LOST not in row and {k: row.get(k) for k in keep} == {k: want.get(k) for k in keep}
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0]) == got[0]
