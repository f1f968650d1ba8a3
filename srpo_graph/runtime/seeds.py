"""Runtime, seeds: every random stream of a run, each derived by one named function.

Consumes the run's seed (``--seed``) and the index of what is drawn (a step, a pass over the
tasks); produces the integer seed of that stream. Nothing else in the package derives a seed
by arithmetic of its own, so two streams never collide by accident and a reader finds every one
here. The values are those of the runs recorded so far (changing a formula changes every run).

* :func:`rollout_seed` -- the step's rollout: the executor derives each episode's and output's
  seed from it (``derive_seed``, ``output_seed``);
* :func:`shuffle_seed` -- the step's mini-batch shuffling in the update;
* :func:`task_order_seed` -- the permutation of the tasks for one pass over them;
* :func:`eval_seed` -- the evaluation rollout and its bootstrap at a step.
"""

from __future__ import annotations

_STEP = 1_000_003  # a prime past any step count: (run seed, index) -> distinct seeds
_EVAL = 7919


def rollout_seed(run_seed: int, step: int) -> int:
    """The seed of step ``step``'s rollout.

    >>> rollout_seed(3, 1)
    3000010
    """
    return run_seed * _STEP + step


def shuffle_seed(run_seed: int, step: int) -> int:
    """The seed of step ``step``'s mini-batch shuffling (the update's own generator).

    >>> shuffle_seed(0, 5)
    5
    """
    return run_seed * _STEP + step


def task_order_seed(run_seed: int, num_pass: int) -> int:
    """The seed of the task permutation of pass ``num_pass`` over the training tasks.

    >>> task_order_seed(1, 0)
    1000003
    """
    return run_seed * _STEP + num_pass


def eval_seed(run_seed: int, step: int) -> int:
    """The seed of the evaluation at step ``step`` (its rollout and its bootstrap intervals).

    >>> eval_seed(2, 10)
    15848
    """
    return run_seed * _EVAL + step
