"""Runtime, seeds: every random stream of a run, each derived by one named function.

Consumes the run's seed (``--seed``) and the index of what is drawn (a step, a pass over the
tasks); produces the integer seed of that stream. Nothing else in the package derives a seed
by arithmetic of its own, so two streams never collide by accident and a reader finds every one
here. The values are those of the runs recorded so far (changing a formula changes every run).

* :func:`rollout_seed` -- the step's rollout; from the run seed of ``runtime.run`` each episode's
  seed is :func:`derive_seed` (run seed, task, sample) and each output's :func:`output_seed`
  (episode seed, output index), so an episode is the same whichever batch or rank samples it;
* :func:`shuffle_seed` -- the step's mini-batch shuffling in the update;
* :func:`task_order_seed` -- the permutation of the tasks for one pass over them;
* :func:`eval_seed` -- the evaluation rollout and its bootstrap at a step.
"""

from __future__ import annotations

import hashlib

_STEP = 1_000_003  # a prime past any step count: (run seed, index) -> distinct seeds
_EVAL = 7919
_M64 = (1 << 64) - 1


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (same parts, same seed, on every machine).

    >>> derive_seed(0, "task-1", 3) == derive_seed(0, "task-1", 3) != derive_seed(0, "task-1", 4)
    True
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def output_seed(episode_seed: int, n: int) -> int:
    """The sampling seed of an episode's ``n``-th output (splitmix64 of the two; 63 bits).

    >>> output_seed(7, 0) != output_seed(7, 1) != output_seed(8, 0)
    True
    >>> 0 <= output_seed(2**63 - 1, 99) < 2**63
    True
    """
    z = (episode_seed + (n + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) >> 1


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
