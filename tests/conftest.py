"""Fixtures for every test directory: the tiny model, copied instead of built again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# where setup.sh built it, read before any test points SRPO_GRAPH_HOME at a temporary home
_HOME = (
    Path(os.environ["SRPO_GRAPH_HOME"]) if os.environ.get("SRPO_GRAPH_HOME") else Path.home() / ".cache" / "srpo-graph"
)


@pytest.fixture(scope="session")
def tiny_copy():
    """``tiny_copy(target)``: the tiny model in the fresh folder ``target`` (returned), copied from the
    one built once per machine (``ensure_tiny_model()`` at ~/.cache/srpo-graph/tiny or the
    SRPO_GRAPH_HOME the session started with, which
    scripts/setup.sh builds and which is rebuilt if stale). A build is 5-10 s of a CI run, a copy
    milliseconds, and builds are deterministic
    (tests/models/test_tiny_model.py::test_build_is_deterministic_and_cached builds one afresh and
    compares), so the copy is byte for byte what a build into ``target`` would write; the tests
    that are about building (tests/models/test_tiny_model.py) still build. A test that gives a run
    a temporary SRPO_GRAPH_HOME copies the model to ``HOME/tiny`` first for the same reason."""
    from srpo_graph.models.tiny import ensure_tiny_model, is_tiny_dir

    source = ensure_tiny_model(_HOME / "tiny")

    def copy(target) -> Path:
        target = Path(target)
        shutil.copytree(source, target)
        assert is_tiny_dir(target)
        return target

    return copy
