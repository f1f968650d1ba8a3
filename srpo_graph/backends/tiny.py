"""Moved to :mod:`srpo_graph.models.tiny` (the locally built models are a stage of their own); this
alias keeps ``srpo_graph.backends.tiny`` imports working: it IS that module (same objects, same
monkeypatch targets). New code imports ``srpo_graph.models.tiny``."""

import sys

from srpo_graph.models import tiny as _moved

sys.modules[__name__] = _moved
