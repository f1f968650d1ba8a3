"""Fixtures for the compiler tests: the real tiny model, for traces made by the real runtime."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_backend(tmp_path_factory, tiny_copy):
    import torch

    from srpo_graph.backends.transformers import TransformersBackend

    torch.set_num_threads(1)
    return TransformersBackend.from_pretrained(str(tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny")))
