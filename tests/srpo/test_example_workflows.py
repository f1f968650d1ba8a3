"""Every example workflow: real traces from the tiny model -> compile -> packed log-probs -> loss.

The trainer's recomputed log-probs must equal the sampler's (same model, temperature and
constraint), every consumed output must be in the batch, and one SRPO loss must backprop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.srpo.logprobs import packed_logprobs
from srpo_graph.srpo.loss import srpo_loss
from srpo_graph.srpo.options import LossConfig

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "workflows").glob("*.wf"))


def _task_file(wf) -> Path:
    own = REPO / "workflows/tasks" / f"{wf.name}.jsonl"  # a workflow's own task file, where it has one
    if own.is_file():
        return own
    fields = {name for name, _ in wf.task_fields}
    if "route" in fields:
        return REPO / "workflows/tasks/routed.jsonl"
    if "target" in fields:
        return REPO / "workflows/tasks/coord.jsonl"
    return REPO / "workflows/tasks" / ("search.jsonl" if wf.name.startswith("search") else "math.jsonl")


@pytest.fixture(scope="module")
def tiny():
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.tiny import ensure_tiny_model

    return TransformersBackend.from_pretrained(str(ensure_tiny_model()))


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A chat model (Qwen3-shaped, its BPE tokenizer and chat template) for the chat-agent examples."""
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.architectures import ensure_local_model

    return TransformersBackend.from_pretrained(str(ensure_local_model("qwen3-test", tmp_path_factory.mktemp("q3"))))


@pytest.mark.slow
@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_example_workflow_compiles_and_recomputes(path, request):
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(path)
    # chat agents need a chat template: the tiny model has none (the checker's no-chat-template)
    tiny = request.getfixturevalue("chat_model" if any(a.chat is not None for a in wf.agents) else "tiny")
    tasks = load_tasks(_task_file(wf), wf)[: 1 if path.stem.startswith("math") else 2]
    result = run(wf, tasks, {p.name: tiny for p in wf.policies}, samples=2, seed=0)
    batch = compile(result.episodes, CompileConfig(policies=tuple(p.name for p in wf.policies)))
    kept = [e for e in result.episodes if e.status != "failed"]
    assert batch.stats.events + batch.stats.dropped_incomplete_events == sum(len(e.transitions) for e in kept)
    models = [tiny.model for _ in wf.policies]
    lp, ent = packed_logprobs(models, batch)
    assert torch.allclose(lp[batch.loss_mask], batch.sampler_logprobs[batch.loss_mask], atol=1e-4)
    loss, diag = srpo_loss(lp, batch, LossConfig(), entropy=ent)
    assert torch.isfinite(loss) and diag.num_events == batch.num_sets
    loss.backward()
    tiny.model.zero_grad(set_to_none=True)
