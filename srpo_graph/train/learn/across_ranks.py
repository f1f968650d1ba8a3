"""Trainer stage, learning: the update's loss diagnostics of the whole batch under data parallelism.

Under ``--nproc N`` each rank back-propagates its shard of whole events, so the diagnostics it
computes (``srpo/diagnostics.py``: sums, maxima, minima) cover that shard only. :func:`whole_batch`
turns every rank's per-epoch diagnostics into the whole batch's *before* any mean is formed: the
sums (loss terms, counts, clip flags, ratios, advantages, per set size, per agent, per policy) are
summed over the ranks, the maxima (log-ratio per set size, ratio, mismatch, importance weight) and
the minimum ratio taken across them. Two collectives per step, whatever the number of epochs and
keys: one ``sum`` and one ``max`` of flat float64 vectors (``collectives.all_reduce_vector``, with
the group's deadline). Every rank knows the vectors' layout without asking: the key lists are
``diagnostics.SUM_KEYS``/``SIZE_KEYS``/``AGENT_KEYS``, and the bins are padded to the whole batch's
sizes (set sizes up to its members, its agents, its policies), so a rank whose shards were empty in
an epoch takes part with zeros.

The result equals one process's diagnostics of the same batch up to float summation order.
"""

from __future__ import annotations

from typing import Sequence

import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.diagnostics import AGENT_KEYS, SIZE_KEYS, SUM_KEYS, LossDiagnostics
from srpo_graph.train.parallel.collectives import all_reduce_vector
from srpo_graph.train.parallel.job import DistInfo

_NEG = float("-inf")


def _pad(t: torch.Tensor | None, n: int, fill: float = 0.0) -> torch.Tensor:
    out = torch.full((n,), fill, dtype=torch.float64)
    if t is not None:
        out[: t.numel()] = t.detach().to("cpu", torch.float64).reshape(-1)[:n]
    return out


def _check_keys(d: LossDiagnostics) -> None:
    for what, got, known in (("sums", d.sums, SUM_KEYS), ("size_sums", d.size_sums, SIZE_KEYS),
                             ("agent_sums", d.agent_sums, AGENT_KEYS)):
        if set(got) != set(known):  # a key diagnose() fills but the reduction would not carry
            raise RuntimeError(f"LossDiagnostics.{what} keys {sorted(got)} differ from diagnostics.py's "
                               f"{sorted(known)}: add the new key there")


def _pack(d: LossDiagnostics | None, z: int, a: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(what sums, what maxes) of one epoch's diagnostics; zeros and -inf for a rank without any."""
    if d is None:
        sums = torch.zeros(len(SUM_KEYS) + z * len(SIZE_KEYS) + a * len(AGENT_KEYS) + 2 * p, dtype=torch.float64)
        return sums, torch.cat([torch.zeros(z, dtype=torch.float64), torch.full((9,), _NEG, dtype=torch.float64)])
    _check_keys(d)
    sums = torch.cat([torch.stack([d.sums[k].detach().to("cpu", torch.float64) for k in SUM_KEYS]),
                      *[_pad(d.size_sums[k], z) for k in SIZE_KEYS], *[_pad(d.agent_sums[k], a) for k in AGENT_KEYS],
                      _pad(d.entropy_by_policy_sum, p), _pad(d.tokens_by_policy, p)])
    flags = [float(d.has_ref), float(d.has_entropy), float(d.weight_hi is not None),
             float(d.entropy_by_policy_sum is not None), float(d.zero_variance_groups)]
    scalars = [-float(d.ratio_lo), float(d.ratio_hi), float(d.mismatch_max),
               float(d.weight_hi) if d.weight_hi is not None else _NEG]
    maxes = torch.cat([_pad(d.size_absmax, z), torch.tensor(scalars + flags, dtype=torch.float64)])
    return sums, maxes


def _unpack(sums: torch.Tensor, maxes: torch.Tensor, z: int, a: int, p: int, *, agents: list[str],
            policies: list[str], batches: int) -> LossDiagnostics:
    i = 0

    def take(n: int, src: torch.Tensor = sums) -> torch.Tensor:
        nonlocal i
        out = src[i : i + n]
        i += n
        return out

    sum_values = take(len(SUM_KEYS))
    size_sums = {k: take(z) for k in SIZE_KEYS}
    agent_sums = {k: take(a) for k in AGENT_KEYS}
    ent, tok = take(p), take(p)
    i = 0
    absmax = take(z, maxes)
    neg_lo, hi, mism, w_hi, has_ref, has_ent, has_w, has_ent_pol, zvg = take(9, maxes).tolist()
    one = torch.ones((), dtype=torch.float64)
    return LossDiagnostics(
        sums={k: sum_values[j] for j, k in enumerate(SUM_KEYS)}, size_sums=size_sums, size_absmax=absmax,
        agent_sums=agent_sums, entropy_by_policy_sum=ent if has_ent_pol > 0 else None,
        tokens_by_policy=tok if has_ent_pol > 0 else None,
        ratio_lo=-neg_lo * one if neg_lo != _NEG else one, ratio_hi=hi * one if hi != _NEG else one,
        mismatch_max=mism * one, has_ref=has_ref > 0, has_entropy=has_ent > 0, agents=agents, policies=policies,
        zero_variance_groups=max(int(zvg), 0), batches=batches, passes=1,
        weight_hi=(w_hi * one if w_hi != _NEG else torch.zeros((), dtype=torch.float64)) if has_w > 0 else None)


def whole_batch(epoch_diags: Sequence[LossDiagnostics | None], mini_batches: Sequence[int], batch: SetBatch | None,
                dist: DistInfo) -> list[LossDiagnostics]:
    """Each epoch's diagnostics over the whole batch, from every rank's (None: this rank's shards of that
    epoch were empty). ``mini_batches``: the epoch's mini-batch count (the same on every rank), which
    the loss terms are averaged over. One process: the diagnostics as they are.

    >>> whole_batch([], [], None, DistInfo())
    []
    """
    if not dist.enabled:
        return [d for d in epoch_diags if d is not None]
    assert batch is not None
    z, a, p = batch.num_members + 1, max(len(batch.agents), 1), max(len(batch.policies), 1)
    packed = [_pack(d, z, a, p) for d in epoch_diags]
    sums = all_reduce_vector(torch.cat([s for s, _ in packed]), "sum", dist) if packed else torch.zeros(0)
    maxes = all_reduce_vector(torch.cat([m for _, m in packed]), "max", dist) if packed else torch.zeros(0)
    n_sum, n_max = packed[0][0].numel() if packed else 0, packed[0][1].numel() if packed else 0
    return [_unpack(sums[e * n_sum : (e + 1) * n_sum], maxes[e * n_max : (e + 1) * n_max], z, a, p,
                    agents=list(batch.agents), policies=list(batch.policies), batches=mini_batches[e])
            for e in range(len(packed))]


__all__ = ["whole_batch"]
