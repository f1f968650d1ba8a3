"""srpo-graph: train multi-agent LLM workflows with Setwise Relative Policy Optimization.

The pipeline, one verb per stage::

    parse(text) -> AST -> check(ast) -> Workflow                (load_workflow(path): both)
    load_backend(kind, model), load_tasks(path, workflow)
    run(workflow, tasks, {policy: backend}, samples=G) -> RunResult(.episodes: [Episode])
    compile(episodes) -> SetBatch -> packed_logprobs(models, batch) -> new log-probs
    srpo_loss(new_logprobs, batch, LossConfig()) -> (loss, diagnostics)
    train(path, TrainConfig()) -> RunSummary                    (all of the above, every step)

docs/tutorial.md section 6 runs it with these names only (tests/test_public_api.py).

The verbs are imported lazily so that ``import srpo_graph`` stays cheap (no torch until needed).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "parse": "srpo_graph.lang.parser",
    "check": "srpo_graph.lang.checker",
    "load_workflow": "srpo_graph.lang",
    "Workflow": "srpo_graph.workflow",
    "load_backend": "srpo_graph.backends",
    "load_tasks": "srpo_graph.runtime.tasks",
    "run": "srpo_graph.runtime.executor",
    "Episode": "srpo_graph.runtime.trace",
    "read_traces": "srpo_graph.runtime.trace",
    "write_traces": "srpo_graph.runtime.trace",
    "compile": "srpo_graph.compiler.compile",
    "SetBatch": "srpo_graph.compiler.setbatch",
    "packed_logprobs": "srpo_graph.srpo.logprobs",
    "srpo_loss": "srpo_graph.srpo.loss",
    "LossConfig": "srpo_graph.srpo.options",
    "train": "srpo_graph.train.trainer",
    "TrainConfig": "srpo_graph.train.config.loading",
    "SrpoGraphError": "srpo_graph.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "train":  # the package is callable: one object whatever was imported (train/__init__.py)
        return importlib.import_module("srpo_graph.train")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'srpo_graph' has no attribute {name!r}")
