"""``srpo-graph eval`` on REAL SGLang servers launched the way ``train`` launches them
(``-o rollout.backend=sglang -o rollout.sglang.launch=cpu``): a run folder's checkpoint is
served, every episode comes back, the report is whole, and no server is left running.
Opt-in outside CI, required in CI (see sglang_servers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srpo_graph.backends.ports import claim_ports  # noqa: E402
from tests.support.sglang_servers import require_sglang  # noqa: E402

pytestmark = pytest.mark.sglang
ROOT = Path(__file__).resolve().parents[2]


def test_eval_a_run_folder_on_sglang(tmp_path):
    import torch

    from srpo_graph.backends.sglang_server import live_servers
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.eval_command import evaluate_all
    from srpo_graph.train.trainer import train

    require_sglang()
    torch.set_num_threads(1)
    wf = ROOT / "workflows" / "coord_par2.wf"
    train(wf, load_config(None, [f"run_dir={json.dumps(str(tmp_path / 'run'))}", "steps=1", "rollout.tasks_per_step=2",
                                 "rollout.samples=2", "eval.every=0", "logging.progress=false",
                                 "logging.tensorboard=false", "logging.plots=false"]))
    before = {id(s) for s in live_servers()}
    reports, _ = evaluate_all(wf, [str(tmp_path / "run")], out=tmp_path / "ev", tasks_path=None, samples=4, seed=0,
                              num_tasks=5, overrides=["rollout.backend=sglang", "rollout.sglang.launch=cpu",
                                                      f"rollout.sglang.port={claim_ports(1)[0]}"])
    (rep,) = reports
    assert rep.overall.episodes == 20 and rep.statuses == {"ok": 20}
    assert 0.0 <= rep.overall.avg.low <= rep.overall.avg.value <= rep.overall.avg.high <= 1.0
    assert set(rep.overall.pass_at) == {1, 2, 4}
    assert {id(s) for s in live_servers()} <= before  # the server it launched stopped with it
    assert (tmp_path / "ev" / "eval.json").is_file()
