"""Trainer stage, parallel: :class:`DistInfo`, this process's place in the job, without torch.

What the launcher of ``srpo-graph train --nproc N`` decides before torchrun starts (the
combinations a job of N processes refuses: ``train/config/refusals.py``) needs the job's size and
nothing else, and that process never runs a model: it must not pay for importing torch (~1 s of
CPU and ~150 MB; Note [A table without torch] in ``strategies.py``). So the job's description lives
here and the process group that fills it in is ``collectives.py``'s (:func:`collectives.init_distributed`),
with :data:`FOLLOW_ENV`, which the launcher of a node without the run folder sets for its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


# set by `train --resume` on a node that cannot read the run folder: it follows rank 0's config and
# checkpoint (multinode.py); here, not there, because the launcher sets it (no torch)
FOLLOW_ENV = "SRPO_GRAPH_FOLLOW_RANK0"

__all__ = ["FOLLOW_ENV", "DistInfo"]
