"""Moved to :mod:`srpo_graph.models.recipes` (the locally built models are a stage of their own); this
alias keeps ``srpo_graph.backends.recipes`` imports working: it IS that module (same objects, same
monkeypatch targets). New code imports ``srpo_graph.models.recipes``."""

import sys

from srpo_graph.models import recipes as _moved

sys.modules[__name__] = _moved
