"""Objective stage: the SRPO loss and its baselines, their options, diagnostics, packed log-probs.

Consumes a :class:`~srpo_graph.compiler.setbatch.SetBatch` and the policies' models; produces
the loss to minimize and its diagnostics. It knows nothing of optimizers, checkpoints or traces.

Entry points: ``loss.srpo_loss``, ``loss.loss_denominator``, ``options.LossConfig``,
``objectives.OBJECTIVES`` (and ``objectives.loss_preset``), ``logprobs.packed_logprobs``.

The modules, in import order (each imports only those before it):

* ``options.py``: ``LossConfig`` and its enums (ratio unit, reduction, surrogate, mismatch), no torch;
* ``objectives.py``: ``OBJECTIVES``, every named objective's loss and compile options and paper;
* ``mismatch.py``: the sampler/trainer and stale-rollout importance weights;
* ``diagnostics.py``: the per-step sums that combine exactly over micro-batches;
* ``loss.py``: SRPO and its baselines in one code path;
* ``lm_head.py``, ``forwards.py``, ``prefix_tree.py`` and ``logprobs.py``: per-policy log-probs
  of the packed stream under the layouts.
"""
