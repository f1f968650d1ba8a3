"""The whole pipeline through the public names of ``srpo_graph`` (what README and docs promise).

parse -> check -> run (real tiny model) -> compile -> save/load -> packed log-probs -> srpo_loss
-> one optimizer step; the parameters change, and only through completion tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

import srpo_graph as sg
from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.models.tiny import ensure_tiny_model
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.srpo.logprobs import packed_logprobs
from srpo_graph.srpo.loss import loss_denominator

ROOT = Path(__file__).resolve().parents[1]


def test_public_names_resolve():
    for name in sg.__all__:
        assert getattr(sg, name) is not None, name


def test_parse_check_run_compile_loss_step(tmp_path):
    torch.manual_seed(0)
    path = ROOT / "workflows" / "coord_mixed.wf"
    text = path.read_text(encoding="utf-8")
    workflow = sg.check(sg.parse(text, str(path)), text)
    assert workflow == sg.load_workflow(path).model_copy(update={"source_hash": workflow.source_hash})
    assert [t.set_sizes for t in workflow.transitions] == [(2,), (1,)]

    backend = TransformersBackend.from_pretrained(str(ensure_tiny_model()))
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", workflow)[:6]
    result = sg.run(workflow, tasks, {"tiny": backend}, samples=4, seed=1)
    episodes = result.episodes
    assert len(episodes) == 24 and all(e.status == "ok" for e in episodes)
    trace_file = tmp_path / "traces.jsonl"
    sg.write_traces(trace_file, episodes)
    assert sg.read_traces(trace_file) == episodes

    batch = sg.compile(episodes)
    assert batch.num_sets == 48 and sorted(set(batch.set_size.tolist())) == [1, 2]
    batch.save(tmp_path / "batch.safetensors")
    batch = sg.SetBatch.load(tmp_path / "batch.safetensors")

    model = backend.model
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    new_logprobs, entropy = packed_logprobs([model], batch)
    # the trainer's model is the sampler's: recomputed log-probs equal the recorded ones
    mask = batch.loss_mask
    assert torch.allclose(new_logprobs[mask].detach(), batch.sampler_logprobs[mask], atol=1e-4)
    config = sg.LossConfig()
    loss, diagnostics = sg.srpo_loss(new_logprobs, batch, config, denominator=loss_denominator(batch, config))
    assert torch.isfinite(loss)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())]
    assert any(changed)
    stats = diagnostics.to_dict()
    # first update from the sampling policy: every set ratio is exactly 1, nothing is clipped
    assert stats["events/k1"] == 24 and stats["events/k2"] == 24
    assert (
        abs(stats["ratio_mean/k2"] - 1.0) < 1e-3 and stats["clip_frac_upper"] == 0.0 and stats["clip_frac_lower"] == 0.0
    )
