"""Fixtures for the compiler tests: the real tiny model, for traces made by the real runtime."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_backend(tmp_path_factory, tiny_copy):
    from tests.support.models import tiny_backend_at

    return tiny_backend_at(tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny"))
