"""Fixtures for the locally built models' tests: the real tiny model, in a temporary directory (a copy:
tests/conftest.py::tiny_copy)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_copy):
    return tiny_copy(tmp_path_factory.mktemp("tinym") / "tiny")
