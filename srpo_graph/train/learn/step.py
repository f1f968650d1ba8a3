"""Trainer stage, learning: one step's update from its episodes (compile, then update; no sync).

:class:`Learner` takes the episodes the rollout stage produced and runs

    compile (``compiler.compile``: traces -> SetBatch) -> old log-probs recomputed with the current
      weights -> epochs x mini-batches x micro-batches (``update.py``)

and hands back a :class:`LearnResult`: the compiled batch (with its recomputed ``old_logprobs``),
what the update did, and the time each part took. The new weights reach the backends in the next
stage (``train/sync.py``); the step's metrics are built by the observing stage (``observe/``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from srpo_graph.compiler.compile import CompileConfig
from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.runtime.seeds import shuffle_seed
from srpo_graph.runtime.trace import Episode
from srpo_graph.train.config.schema import TrainConfig
from srpo_graph.train.learn.update import UpdateResult, recompute_old_logprobs, update_policies
from srpo_graph.train.parallel.job import DistInfo


@dataclass
class LearnResult:
    """What one step's learning did.

    Attributes:
        batch: the compiled SetBatch; its ``old_logprobs`` recomputed when it has sets.
        update: the update's result, or None when no set had a non-zero advantage (no update).
        seconds_compile, seconds_old_logprobs, seconds_update: wall time of each part.
    """

    batch: SetBatch
    update: UpdateResult | None
    seconds_compile: float = 0.0
    seconds_old_logprobs: float = 0.0
    seconds_update: float = 0.0


class Learner:
    """Compiles each step's episodes and updates the trained policies (``policies``: the policies
    stage's slots, in the order of ``compile_config.policies``)."""

    def __init__(self, policies: Sequence[Any], config: TrainConfig, compile_config: CompileConfig,
                 dist: DistInfo) -> None:
        self.policies, self.config, self.compile_config, self.dist = list(policies), config, compile_config, dist

    def learn(self, step: int, episodes: list[Episode]) -> LearnResult:
        """Step ``step``'s update on ``episodes``: compile, recompute old log-probs, update."""
        o = self.config.optim
        t0 = time.perf_counter()
        batch = compile_batch(episodes, self.compile_config)
        result = LearnResult(batch, None, seconds_compile=time.perf_counter() - t0)
        if not batch.num_sets:
            return result
        t0 = time.perf_counter()
        batch, _ = recompute_old_logprobs([p.model for p in self.policies], batch, layout=o.layout,
                                          autocast=o.autocast)
        result.batch, result.seconds_old_logprobs = batch, time.perf_counter() - t0
        t0 = time.perf_counter()
        result.update = update_policies(
            self.policies, batch, self.config.loss, epochs=o.epochs, mini_batches=o.mini_batches,
            grad_clip=o.grad_clip, seed=shuffle_seed(self.config.seed, step), dist=self.dist,
            inject_nonfinite=step in self.config.debug.nonfinite_at_steps, strategy=self.config.strategy,
            layout=o.layout, rollback_nonfinite=o.rollback_nonfinite, autocast=o.autocast)
        result.seconds_update = time.perf_counter() - t0
        return result
