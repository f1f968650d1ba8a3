"""LoRA adapter policies (issue 13): one frozen base, one adapter and one optimizer per policy.

On CPU with the real tiny model: a joint event updates both adapters and never the base; the
log-probs of record equal the trainer's recomputation with adapters switched per batch;
checkpoints hold adapters only (peft format) and resume exactly; export merges an adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run as run_episodes
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train import checkpoint as ck
from srpo_graph.train.config.loading import validate
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies
from srpo_graph.train.observe.metrics import deterministic_fields, read_metrics
from srpo_graph.train.policies.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterModel, SharedBase, export_adapter
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_lora2.wf"
MIXED = """workflow lo
import std
task { target: int }
policy base = "tiny"
policy role_a = lora("base", r=4, alpha=8, targets=[q_proj, v_proj])
policy role_b = lora("base", r=2, alpha=4, targets=[k_proj, o_proj, gate_proj])
agent a { policy: role_a prompt: "<a>{task.target}" sample { max_tokens: 1, allow: ["1", "2", "3", "4", "5"] }
  output: int via std.digit }
agent b { policy: role_b prompt: "<b>{task.target}" sample { max_tokens: 1, allow: ["1", "2", "3", "4", "5"] }
  output: int via std.digit }
agent c { policy: base prompt: "<c>{task.target}" sample { max_tokens: 2 } output: text }
transition joint { consume: a, b, c activate: end }
start: a, b, c
reward: std.digits_sum_to(task.target, a, b)
"""


def _shared(wf, seed: int = 0):
    torch.manual_seed(seed)
    from srpo_graph.models import resolve_model

    adapters = [p for p in wf.policies if p.adapter is not None]
    shared = SharedBase(resolve_model("tiny"), adapters, dtype=torch.float32, device="cpu")
    with torch.no_grad():  # lora_B starts at 0 (adapter == base): make every adapter differ
        for p in (q for a in adapters for q in shared.adapter_parameters(a.name)):
            p.add_(0.05 * torch.randn_like(p))
    return shared


def _models(wf, shared):
    return [AdapterModel(shared, p.name if p.adapter is not None else None) for p in wf.policies]


@pytest.fixture
def mixed(tmp_path):
    path = tmp_path / "lo.wf"
    path.write_text(MIXED)
    return load_workflow(path)


def _episodes(wf, models, tok, samples: int = 4):
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", wf)[:3]
    backends = {p.name: TransformersBackend(m, tok) for p, m in zip(wf.policies, models)}
    return run_episodes(wf, tasks, backends, samples=samples, seed=3).episodes


def test_sampler_logprobs_match_the_trainer_with_adapters_switched(mixed):
    from srpo_graph.models.tiny import load_tokenizer

    shared = _shared(mixed)
    models = _models(mixed, shared)
    eps = _episodes(mixed, models, load_tokenizer(shared.path))
    assert {o.policy for e in eps for o in e.outputs} == {"base", "role_a", "role_b"}
    batch = compile_batch(eps, validate({}).compile.model_copy(update={"policies": ("base", "role_a", "role_b")}))
    _, mismatch = recompute_old_logprobs(models, batch)
    assert mismatch["max_abs"] < 1e-5, mismatch
    # the adapters really change the distribution: the base's log-probs differ
    base_only = [models[0]] * 3
    _, vs_base = recompute_old_logprobs(base_only, batch)
    assert vs_base["max_abs"] > 1e-3


def test_a_joint_event_updates_both_adapters_and_never_the_base(mixed):
    from srpo_graph.models.tiny import load_tokenizer

    shared = _shared(mixed)
    models = _models(mixed, shared)
    eps = _episodes(mixed, models, load_tokenizer(shared.path), samples=6)
    batch = compile_batch(eps, validate({}).compile.model_copy(update={"policies": ("base", "role_a", "role_b")}))
    assert int(batch.set_size.max()) == 3  # one event holds members of both adapters and of the base
    batch, _ = recompute_old_logprobs(models, batch)
    # the rewards of 3 tasks may all tie (zero advantages, zero gradient): give every event one
    batch = batch.with_(set_advantage=torch.linspace(-1.0, 1.0, batch.num_sets))
    base_before = {n: p.detach().clone() for n, p in shared.inner.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in shared.peft.named_parameters() if "lora_" in n}
    opts = [torch.optim.AdamW(list(m.parameters()), lr=1e-2, weight_decay=0.0) for m in models]
    assert [sum(p.requires_grad for p in m.parameters()) for m in models][0] == 0  # the base trains nothing
    upd = update_policies(
        [UpdatePolicy(m, o) for m, o in zip(models, opts)],
        batch,
        LossConfig(),
        epochs=1,
        mini_batches=1,
        grad_clip=1.0,
        seed=0,
    )
    assert upd.num_updates == 1 and upd.grad_norm["role_a"] > 0 and upd.grad_norm["role_b"] > 0
    for n, p in shared.inner.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), f"base weight {n} changed"
    changed = {
        a: any(not torch.equal(p, lora_before[n]) for n, p in shared.peft.named_parameters() if f".{a}." in n)
        for a in ("role_a", "role_b")
    }
    assert changed == {"role_a": True, "role_b": True}
    # each adapter has its own optimizer over its own parameters only
    ids = [{id(p) for g in o.param_groups for p in g["params"]} for o in opts[1:]]
    assert ids[0] and ids[1] and not ids[0] & ids[1]


def _config(run: Path, **over):
    data = {
        "run_dir": str(run),
        "steps": 4,
        "seed": 5,
        "rollout": {"tasks_per_step": 2, "samples": 4},
        "checkpoint": {"every": 2, "keep_last": 3},
        "eval": {"every": 0},
        "logging": {"tensorboard": False, "plots": False, "progress": False},
    }
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return validate(data)


def _adapters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {
        f"{pol}/{k}": v
        for pol in ("role_a", "role_b")
        for k, v in load_file(checkpoint / "policies" / pol / ADAPTER_WEIGHTS).items()
    }


@pytest.mark.slow
def test_checkpoints_hold_adapters_only_and_resume_exactly(tmp_path):
    whole = train(WF, _config(tmp_path / "whole"))
    assert whole.steps == 4
    step4 = tmp_path / "whole" / "checkpoints" / "step_4"
    for pol in ("role_a", "role_b"):  # the peft format, and nothing of the base
        folder = step4 / "policies" / pol
        assert json.loads((folder / ADAPTER_CONFIG).read_text())["peft_type"] == "LORA"
        assert sorted(p.name for p in folder.glob("*.safetensors")) == [ADAPTER_WEIGHTS]
        assert all("lora_" in k for k in load_file(folder / ADAPTER_WEIGHTS))
    assert not any((step4 / "policies" / "base").glob("model*.safetensors"))
    size = sum(p.stat().st_size for p in (step4 / "policies").rglob("*.safetensors"))
    assert size < 200_000, size  # the tiny base alone is ~0.5 MB
    assert ck.verify_checkpoint(step4) is None

    part = _config(tmp_path / "part", debug={"stop_after_step": 2})
    train(WF, part)
    resumed = train(WF, _config(tmp_path / "part"), resume=True)
    assert resumed.steps_this_run == 2
    a, b = _adapters(step4), _adapters(tmp_path / "part" / "checkpoints" / "step_4")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [deterministic_fields(r) for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")]
    again = [deterministic_fields(r) for r in read_metrics(tmp_path / "part" / "metrics.jsonl")]
    assert [r["loss"] for r in rows] == [r["loss"] for r in again]
    assert [r["reward"] for r in rows] == [r["reward"] for r in again]

    # export: the merged full model computes what base + adapter computed
    out = export_adapter(tmp_path / "whole", "role_a", tmp_path / "exported")
    from transformers import AutoModelForCausalLM

    from srpo_graph.models import resolve_model

    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    wf = load_workflow(WF)
    shared = SharedBase(
        resolve_model("tiny"),
        [p for p in wf.policies if p.adapter is not None],
        dtype=torch.float32,
        device="cpu",
        resume_from=step4,
    )
    ids = torch.tensor([[1, 14, 40, 41]])
    with torch.no_grad():
        want = AdapterModel(shared, "role_a")(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        base = AdapterModel(shared, None)(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    assert not torch.allclose(base, got, atol=1e-6)  # training moved the adapter


def test_export_refuses_the_frozen_base_and_full_policies(tmp_path):
    from srpo_graph.errors import ConfigError

    with pytest.raises(ConfigError, match="no good checkpoint"):
        export_adapter(tmp_path, "role_a", tmp_path / "out")


@pytest.mark.slow
def test_one_command_checks_draws_trains_resumes_and_exports(tmp_path):
    """The issue's "done when", as a user types it (the CLI in process: tests/support/cli.py)."""
    from tests.support.cli import invoke

    def cli(*args):
        out = invoke(*args, cwd=ROOT)
        assert out.exit_code == 0, out.stderr[-3000:]
        return out.stdout

    assert "adapters:    base" in cli("check", WF)
    cli("viz", WF, "-o", tmp_path / "g.png")
    cli("viz", WF, "-o", tmp_path / "g.dot")
    assert "role_a: lora r=8 on base" in (tmp_path / "g.dot").read_text()
    run = tmp_path / "run"
    common = [
        "rollout.tasks_per_step=2",
        "rollout.samples=2",
        "checkpoint.every=1",
        "eval.every=0",
        "logging.plots=false",
        "logging.tensorboard=false",
    ]
    cli("train", WF, "--steps", 2, "--run-dir", run, "debug.stop_after_step=1", *common)
    cli("train", WF, "--resume", run)
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    cli("export-adapter", run, "--policy", "role_b", tmp_path / "role_b")
    assert (tmp_path / "role_b" / "model.safetensors").is_file()
