"""Fixtures for the runtime tests: the real tiny model (copied into a temporary directory:
tests/conftest.py::tiny_copy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# failing_tools: a user's tool module, found on sys.path as a user's own module would be
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_backend(tmp_path_factory, tiny_copy):
    from tests.support.models import tiny_backend_at

    return tiny_backend_at(tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny"))


@pytest.fixture(scope="session")
def coord_tasks():
    from srpo_graph.runtime.tasks import Task

    return [Task(id=f"t{i}", fields={"target": i}) for i in range(6)]
