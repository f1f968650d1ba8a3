"""Compiler stage: episode traces -> packed active-set tensors (SetBatch), advantages, micro-batches.

Entry points: ``compile.compile``, ``setbatch.SetBatch``, ``advantages.compute_advantages``.
"""
