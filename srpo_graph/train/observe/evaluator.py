"""Trainer stage, observing: the held-out evaluation every ``eval.every`` steps.

Consumes the workflow as evaluated (greedy when ``eval.mode = "greedy"``), the held-out tasks and
the policies' backends; produces the ``eval/...`` entries of a step's record: Avg@k, Pass@k and
their intervals over the problems (``srpo_graph.eval``), from ``eval.samples`` episodes per task
sampled by the rollout stage (``rollout.lockstep.rollout``, a collective under torchrun) with the
step's evaluation seed (``runtime.seeds.eval_seed``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from srpo_graph.eval.score import score
from srpo_graph.runtime.seeds import eval_seed
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.rollout.lockstep import rollout


class Evaluator:
    """Scores the policies on the held-out tasks at the steps :meth:`due` says."""

    def __init__(self, wf_eval: Any, tasks: Sequence[Any], config: Any, dist: DistInfo, policies: Sequence[Any],
                 frozen: dict[str, Any]) -> None:
        self.wf, self.tasks, self.config, self.dist = wf_eval, list(tasks), config, dist
        self.policies, self.frozen = policies, frozen

    def due(self, step: int) -> bool:
        """Every ``eval.every`` steps and at the last, when there are held-out tasks."""
        every = self.config.eval.every
        return bool(every and self.tasks and (step % every == 0 or step == self.config.steps))

    def evaluate(self, step: int) -> dict[str, float]:
        """The scores at step ``step`` (``eval/reward`` = Avg@k, ``eval/pass@k``, ...) and ``time/eval``."""
        t0 = time.perf_counter()
        seed = eval_seed(self.config.seed, step)
        samples = self.config.eval.samples
        episodes, _ = rollout(self.wf, self.tasks, self.policies, self.config, seed, self.dist, samples,
                              frozen=self.frozen)
        scores = score(self.wf, episodes, self.tasks, samples=samples, seed=seed).metrics()
        return {**scores, "time/eval": time.perf_counter() - t0}
