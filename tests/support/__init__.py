"""Helpers shared by the test directories (importable as ``tests.support``: pyproject.toml puts the
repository root on pytest's ``pythonpath``, so no test adds to ``sys.path`` to reach them).

* :mod:`tests.support.waiting` -- wait for a state a real process reports (a file, a line, a
  number of metrics rows), with a deadline that restarts on every sign of progress, so a loaded
  machine slows a test down instead of failing it.
* :mod:`tests.support.tmpfs` -- a real full disk: a small tmpfs in a user+mount namespace
  (``unshare -rm``, no root), sized in pages.
* :mod:`tests.support.models` -- the tiny model as a backend, and the wrappers that take a
  causal LM's optional forward arguments away (``NoKeep``, ``NoCache``).
"""
