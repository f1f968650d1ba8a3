"""The whole-batch diagnostics' layout (``train/learn/across_ranks.py``), in one process.

What two ranks' all-reduce does to the packed vectors (a sum, an elementwise max) is done here by
hand on the real diagnostics of ``srpo_loss`` over the shards of one batch (synthetic episodes, sets
of 1 to 5 members over three policies, stale sampler log-probs, decoupled weights, entropy): the
result must equal the diagnostics of the whole batch in every key of ``to_dict``, also when a rank's
shard is empty (it packs ``None``). The real collective is exercised by test_nproc_metrics.py.
"""

from __future__ import annotations

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.learn.across_ranks import _pack, _unpack
from srpo_graph.train.parallel.collectives import shard_sets


@pytest.fixture(scope="module")
def batch():
    b = compile(synthetic_episodes(3, 4, seed=7, max_set=5, policies=("p0", "p1", "p2")), CompileConfig())
    g = torch.Generator().manual_seed(3)
    mu = b.old_logprobs - 0.15 * torch.randn(b.num_tokens, generator=g) * b.loss_mask
    return b.with_(sampler_logprobs=mu.float())


@pytest.mark.parametrize("world", [2, 3, 40])  # 40 ranks: most hold no set (they pack None)
@pytest.mark.parametrize("mismatch", ["none", "decoupled"])
def test_shards_summed_and_maxed_equal_the_whole_batch(batch, world, mismatch):
    cfg = LossConfig(mismatch=mismatch, mismatch_threshold=1.3)
    denom = loss_denominator(batch, cfg)
    # every rank sees its part of the same new log-probs (the whole batch's, selected per token)
    g = torch.Generator().manual_seed(0)
    new = batch.old_logprobs.double() + 0.25 * torch.randn(batch.num_tokens, generator=g, dtype=torch.float64)
    ent = torch.rand(batch.num_tokens, generator=g, dtype=torch.float64)
    whole = srpo_loss(new, batch, cfg, denominator=denom, entropy=ent)[1]
    z, a, p = batch.num_members + 1, max(len(batch.agents), 1), max(len(batch.policies), 1)
    packed = []
    for idx in (shard_sets(batch.set_tokens.tolist(), r, world) for r in range(world)):
        if not idx:
            packed.append(_pack(None, z, a, p))
            continue
        part = batch.select_sets(idx)
        tok = _token_index(batch, idx)
        packed.append(_pack(srpo_loss(new[tok], part, cfg, denominator=denom, entropy=ent[tok])[1], z, a, p))
    assert any(len(shard_sets(batch.set_tokens.tolist(), r, world)) == 0 for r in range(world)) == (world == 40)
    sums = torch.stack([s for s, _ in packed]).sum(0)
    maxes = torch.stack([m for _, m in packed]).max(0).values
    got = _unpack(sums, maxes, z, a, p, agents=list(batch.agents), policies=list(batch.policies), batches=1).to_dict()
    want = whole.to_dict()
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), k


def _token_index(b, sets):
    """The whole batch's token positions of ``sets``' members, in the order select_sets lays them out."""
    offsets, member_set = b.member_offsets.tolist(), b.member_set.tolist()
    out = []
    for s in sets:
        for m in range(b.num_members):
            if member_set[m] == s:
                out.extend(range(offsets[m], offsets[m + 1]))
    return torch.tensor(out, dtype=torch.int64)
