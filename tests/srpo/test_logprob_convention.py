"""Log-probs of record under top-k / top-p (issue 8, item 8): two conventions, each consistent.

``full``: the sampler records the full temperature-scaled distribution's log-prob, the
trainer recomputes it from the model alone. ``sampled``: the sampler records the truncated,
renormalized distribution it actually sampled from, and the trainer re-applies the filters.
Real tiny model, real runtime, real trainer recomputation: sampler and trainer agree to float
precision under both, and the two records differ by the truncation's mass (log Z_kept >= 0)."""

from __future__ import annotations

import pytest
import torch

from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.srpo.logprobs import packed_logprobs
from srpo_graph.train.rollout.tasks import override_workflow

WF = """
workflow topk "one agent, truncated sampling"
import std
task { target: int }
policy tiny = "tiny"
agent a {
  policy: tiny
  prompt: "<a>{task.target}"
  sample { temperature: 1.3, top_k: 4, top_p: 0.8, max_tokens: 6 }
  output: text via std.text
}
transition t {
  consume: a
  activate: end
}
start: a
max_steps: 2
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_copy):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("topk")
    (d / "topk.wf").write_text(WF)
    backend = TransformersBackend.from_pretrained(str(tiny_copy(d / "tiny")))
    return load_workflow(d / "topk.wf"), backend


def _batch(setup, mode):
    wf, backend = setup
    wf = override_workflow(wf, logprobs=mode)
    eps = run(wf, [Task(id=f"t{i}", fields={"target": i}) for i in range(6)], {"tiny": backend},
              samples=4, seed=9).episodes
    assert all(o.logprob_mode == mode and o.top_k == 4 for e in eps for o in e.outputs)
    return compile(eps, CompileConfig(micro_batch_tokens=0, policies=("tiny",)))


@pytest.mark.parametrize("mode", ["full", "sampled"])
def test_trainer_recomputes_what_the_sampler_recorded(setup, mode):
    b = _batch(setup, mode)
    with torch.no_grad():
        lp, _ = packed_logprobs([setup[1].model], b)
    m = b.loss_mask
    assert int(m.sum()) > 50
    assert (lp[m] - b.sampler_logprobs[m]).abs().max().item() < 1e-4


def test_sampled_record_is_the_renormalized_truncation(setup):
    full, sampled = _batch(setup, "full"), _batch(setup, "sampled")
    assert torch.equal(full.input_ids, sampled.input_ids)  # same seeds: the same tokens were drawn
    m = full.loss_mask
    gap = sampled.sampler_logprobs[m] - full.sampler_logprobs[m]  # = log Z_kept^-1 >= 0 per token
    assert (gap >= -1e-5).all() and gap.mean().item() > 0.05
    # the full record seen by a trainer that assumes the sampled convention is off by exactly that gap
    with torch.no_grad():
        lp_trunc, _ = packed_logprobs([setup[1].model], sampled)
    assert torch.allclose(lp_trunc[m] - full.sampler_logprobs[m], gap, atol=1e-4)
