"""Compiler stage: episode traces -> packed active-set tensors (SetBatch), advantages, micro-batches.

Entry points: ``compile.compile``, ``setbatch.SetBatch``, ``advantages.compute_advantages``. The
modules: ``compile.py`` (traces -> SetBatch; the provenance return rule), ``advantages.py``
(``GROUPERS``), ``options.py`` (``CompileConfig``, no torch), ``setbatch.py`` (the tensors and the
file format), ``summary.py`` (``inspect``), ``synthetic.py`` (schema-valid traces for tests and
benchmarks), ``commands.py`` (``compile``, ``inspect``).
"""
