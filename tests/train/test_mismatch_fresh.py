"""The sampler/trainer gap of record (``train/observe/mismatch.agent_mismatch``) is measured on the
outputs sampled at the weights being updated: under overlapped rollouts an older output's gap
also holds the updates since it was sampled, and is reported apart (``stale_mean_abs``).

Real rollout (tiny model, transformers backend, coord_mixed: three agents), real compile and the
trainer's forward after a real change of the weights; the expected numbers come from a plain
per-member loop over the trace."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_the_gap_of_record_is_on_fresh_outputs_and_the_stale_gap_apart(tiny_copy, tmp_path):
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.train.learn.update import recompute_old_logprobs
    from srpo_graph.train.observe.mismatch import agent_mismatch

    torch.set_num_threads(1)
    backend = TransformersBackend.from_pretrained(str(tiny_copy(tmp_path / "tiny")))
    wf = load_workflow(ROOT / "workflows" / "coord_mixed.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", wf)[:4]
    episodes = run(wf, tasks, {"tiny": backend}, samples=4, seed=0).episodes
    batch = compile(episodes, CompileConfig(micro_batch_tokens=0))
    # half of the members were "sampled a version earlier": the trainer now holds version 1 ...
    old = batch.member_policy_version.clone()
    old[::2] = 0
    old[1::2] = 1
    batch = batch.with_(member_policy_version=old)
    with torch.no_grad():  # ... whose weights differ from the sampler's by a real change
        for p in backend.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch, _ = recompute_old_logprobs([backend.model], batch)
    got = agent_mismatch(batch, {"tiny": 1})
    # the reference: a loop over members
    off, done = batch.member_offsets.tolist(), batch.loss_mask.bool()
    fresh, stale, by_agent = [], [], {}
    for m in range(batch.num_members):
        sel = slice(off[m], off[m + 1])
        gaps = (batch.old_logprobs[sel] - batch.sampler_logprobs[sel]).abs()[done[sel]].tolist()
        (fresh if int(old[m]) == 1 else stale).extend(gaps)
        if int(old[m]) == 1:
            by_agent.setdefault(batch.agents[int(batch.member_agent[m])], []).extend(gaps)
    assert abs(got["mean_abs"] - sum(fresh) / len(fresh)) < 1e-6 and got["max_abs"] == max(fresh)
    assert abs(got["stale_mean_abs"] - sum(stale) / len(stale)) < 1e-6
    assert got["fresh_share"] == len(fresh) / (len(fresh) + len(stale))
    for agent, gaps in by_agent.items():
        assert abs(got[f"{agent}/mean_abs"] - sum(gaps) / len(gaps)) < 1e-6 and got[f"{agent}/max_abs"] == max(gaps)
    # every output fresh (the synchronous loop): one gap over all, nothing stale
    everything = agent_mismatch(batch.with_(member_policy_version=torch.ones_like(old)), {"tiny": 1})
    assert everything["fresh_share"] == 1.0 and "stale_mean_abs" not in everything
    assert everything["max_abs"] == max(fresh + stale)
