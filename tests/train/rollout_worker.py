"""Worker for test_rollout_ranks.py (not a test file): one rollout (``rollout_stage.rollout``) of a
workflow's tasks with the transformers backend on the tiny model, as a plain process or on every
rank of a torchrun job (gloo). For the K-th ``WORKFLOW,TASKS`` pair each rank writes
``job<K>_rank<R>.json``: the episodes (JSON lines, in the order it holds them) and the statistics,
or the error that stopped the rollout.

Usage: python rollout_worker.py OUT_DIR WORKFLOW,TASKS[,RANK] [WORKFLOW,TASKS[,RANK] ...] [KEY=JSON ...]
(KEYs: config fields, e.g. ``rollout.max_failed_fraction=0.4``, ``rollout.every_rank=false``). A job
with a RANK has that rank's backend raise a BackendError (:class:`FailingBackend`).
"""

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from srpo_graph.backends import TrainedPolicy, backend_spec
from srpo_graph.errors import BackendError, SrpoGraphError
from srpo_graph.lang import load_workflow
from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import load_tokenizer
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.train.config.loading import validate
from srpo_graph.train.parallel.collectives import init_distributed, shutdown
from srpo_graph.train.rollout.lockstep import rollout


class FailingBackend:
    """Test double: a backend that raises on every call, on one rank only -- a fault of one rank's
    engine (e.g. a GPU error) that the real transformers backend cannot produce on demand."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def generate(self, requests):
        raise BackendError("the engine of this rank failed (test double)")


def main(out: Path, *args: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed("cpu", timeout=120)
    data: dict = {}
    for item in (a for a in args if "=" in a):
        key, value = item.split("=", 1)
        *sections, name = key.split(".")
        node = data
        for part in sections:
            node = node.setdefault(part, {})
        node[name] = json.loads(value)
    config = validate(data, "worker")
    out.mkdir(parents=True, exist_ok=True)
    models: dict[str, TrainedPolicy] = {}
    for k, job in enumerate(a for a in args if "=" not in a):
        wf_path, task_path, *failing = job.split(",")
        wf = load_workflow(wf_path)
        for pol in wf.policies:
            path = resolve_model(pol.model)
            if path not in models:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
                models[path] = TrainedPolicy(pol.name, path, model, load_tokenizer(path), "cpu")
        trained = [dataclasses.replace(models[resolve_model(p.model)], name=p.name) for p in wf.policies]
        backends = backend_spec("transformers").for_training(trained, config.rollout.transformers, out)
        if failing and int(failing[0]) == dist.rank:
            backends = {k: FailingBackend(b) for k, b in backends.items()}
        slots = [SimpleNamespace(name=p.name, backend=backends[p.name], version=3) for p in trained]
        try:
            episodes, stats = rollout(wf, load_tasks(task_path, wf), slots, config, 1234, dist, config.rollout.samples)
            result: dict = {"episodes": [e.to_json() for e in episodes], "stats": stats.model_dump(mode="json")}
        except SrpoGraphError as exc:
            result = {"error": type(exc).__name__, "message": str(exc)}
        (out / f"job{k}_rank{dist.rank}.json").write_text(json.dumps(result))
    shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
