"""Fixtures for the backend tests: the real tiny model, built into a temporary directory."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from srpo_graph.backends.tiny import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.mktemp("tinyb") / "tiny")


@pytest.fixture(scope="session")
def tiny_backend(tiny_dir):
    import torch

    from srpo_graph.backends.transformers import TransformersBackend

    torch.set_num_threads(1)
    return TransformersBackend.from_pretrained(str(tiny_dir))
