"""``train --plan``: where servers and trainer ranks go, as pure logic over 1, 2, 8 GPUs and 1-3 policies."""

import shlex

import pytest

from srpo_graph.train.parallel.placement import plan

POLICIES = [("solver", "/m/solver"), ("judge", "/m/judge"), ("router", "/m/router")]


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_gpu_has_a_role_and_every_policy_a_server(gpus, n):
    p = plan(gpus, POLICIES[:n])
    served = {g for s in p.servers for g in s.gpus}
    assert [s.policy for s in p.servers] == [name for name, _ in POLICIES[:n]]
    assert served | set(p.trainer_gpus) == set(range(gpus))  # nothing idle
    assert len({s.port for s in p.servers}) == n  # one port each
    if gpus == 1:
        assert p.trainer_gpus == (0,) and sum(s.mem_fraction for s in p.servers) <= 0.5 + 1e-9  # the trainer's half
    else:
        assert not served & set(p.trainer_gpus)  # rollout and update never share a GPU
        assert len(p.trainer_gpus) >= len(served)
        for g in served:  # servers sharing a GPU split its memory
            assert sum(s.mem_fraction for s in p.servers if g in s.gpus) <= 0.85 + 1e-9
    if gpus >= 2 * n:  # enough GPUs: no policy shares one
        assert all(len(set(a.gpus) & set(b.gpus)) == 0 for a in p.servers for b in p.servers if a is not b)


def test_commands_start_each_server_on_its_gpus_and_point_the_trainer_at_them():
    p = plan(8, POLICIES[:2], train_args=["optim.lr=1e-6"])
    cmds = p.commands("wf/debate.wf")
    assert len(cmds) == 3
    s0 = shlex.split(cmds[0].removesuffix(" &"))
    assert s0[0] == "CUDA_VISIBLE_DEVICES=0,2" and "--dp-size" in s0 and s0[s0.index("--port") + 1] == "30000"
    train = shlex.split(cmds[-1])
    assert train[0] == "CUDA_VISIBLE_DEVICES=4,5,6,7" and train[train.index("--nproc") + 1] == "4"
    assert 'rollout.sglang.urls={solver = "http://127.0.0.1:30000", judge = "http://127.0.0.1:30001"}' in train
    assert train[-1] == "optim.lr=1e-6"


def test_plan_refuses_nonsense():
    with pytest.raises(ValueError, match="--gpus"):
        plan(0, POLICIES[:1])
    with pytest.raises(ValueError, match="no trainable policy"):
        plan(2, [])


def test_the_cli_prints_the_plan_and_starts_nothing(tmp_path):
    from pathlib import Path

    from click.testing import CliRunner

    from srpo_graph.cli import app

    wf = Path(__file__).resolve().parents[2] / "workflows" / "coord_mixed.wf"
    res = CliRunner().invoke(app, ["train", str(wf), "--plan", "2", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "0  serves tiny" in res.output and "1  trains" in res.output and "sglang.launch_server" in res.output
    assert not (tmp_path / "r").exists()
