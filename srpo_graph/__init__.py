"""srpo-graph: train multi-agent LLM workflows with Setwise Relative Policy Optimization.

The pipeline, one verb per stage::

    parse(text) -> AST -> check(ast) -> Workflow -> run(workflow, tasks, backends) -> [Episode]
        -> compile(episodes) -> SetBatch -> srpo_loss(new_logprobs, batch, config) -> train(...)

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
    "run": "srpo_graph.runtime.executor",
    "Episode": "srpo_graph.runtime.trace",
    "read_traces": "srpo_graph.runtime.trace",
    "write_traces": "srpo_graph.runtime.trace",
    "compile": "srpo_graph.compiler.compile",
    "SetBatch": "srpo_graph.compiler.setbatch",
    "srpo_loss": "srpo_graph.srpo.loss",
    "LossConfig": "srpo_graph.srpo.loss",
    "train": "srpo_graph.train.trainer",
    "TrainConfig": "srpo_graph.train.config",
    "SrpoGraphError": "srpo_graph.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'srpo_graph' has no attribute {name!r}")
