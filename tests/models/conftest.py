"""Fixtures for the locally built models' tests: the real tiny model, built into a temporary directory."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from srpo_graph.models.tiny import ensure_tiny_model

    return ensure_tiny_model(tmp_path_factory.mktemp("tinym") / "tiny")
