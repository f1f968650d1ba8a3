"""Fixtures for the runtime tests: the real tiny model (copied into a temporary directory:
tests/conftest.py::tiny_copy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # runtime_workflows, failing_tools (a user's tool module)


@pytest.fixture(scope="session")
def tiny_backend(tmp_path_factory, tiny_copy):
    import torch

    from srpo_graph.backends.transformers import TransformersBackend

    torch.set_num_threads(1)
    path = tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny")
    return TransformersBackend.from_pretrained(str(path))


@pytest.fixture(scope="session")
def coord_tasks():
    from srpo_graph.runtime.tasks import Task

    return [Task(id=f"t{i}", fields={"target": i}) for i in range(6)]
