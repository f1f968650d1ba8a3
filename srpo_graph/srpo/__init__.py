"""Objective stage: the SRPO loss and its baselines (``loss``), diagnostics, packed log-probs.

Entry points: ``loss.srpo_loss``, ``loss.LossConfig``, ``loss.loss_denominator``,
``logprobs.packed_logprobs``.
"""
