"""Fixtures for the backend tests: the real tiny model, in a temporary directory (a copy:
tests/conftest.py::tiny_copy)."""

from __future__ import annotations

import pytest

from tests.support.sglang_servers import sglang_unavailable


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_copy):
    return tiny_copy(tmp_path_factory.mktemp("tinyb") / "tiny")


@pytest.fixture(scope="session")
def tiny_backend(tiny_dir):
    from tests.support.models import tiny_backend_at

    return tiny_backend_at(tiny_dir)


@pytest.fixture(scope="session")
def sglang_url(tiny_dir, tmp_path_factory):
    """URL of a real SGLang server serving ``tiny_dir``'s weights (started for the session, stopped
    right after the last test that uses it: tests/support/last_use.py).

    It is the "cpu" preset launched the way workflows/tinymath_external_verifier.wf's comment
    launches its verifier (:data:`tests.support.sglang_servers.CHAT_FLAGS`: a raw chat template,
    OpenAI sampling defaults), so test_external_policy.py's ``/v1/chat/completions`` tests share it
    instead of starting a server of their own (the flags only change the OpenAI routes' prompt and
    the defaults of the sampling parameters a request leaves out; SGLangBackend sends every one).

    SRPO_GRAPH_SGLANG_URL: use that server instead (it must serve the tiny model built by
    scripts/setup.sh, ~/.cache/srpo-graph/tiny, launched with --enable-custom-logit-processor).
    """
    import os

    from tests.support.last_use import release_after_last_use
    from tests.support.sglang_servers import start_real_servers

    why = sglang_unavailable()
    if why:
        if os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG"):
            pytest.fail(f"SRPO_GRAPH_REQUIRE_SGLANG is set but {why}")
        pytest.skip(why)
    if os.environ.get("SRPO_GRAPH_SGLANG_URL"):
        yield os.environ["SRPO_GRAPH_SGLANG_URL"].rstrip("/")
        return
    (server,) = start_real_servers([tiny_dir], tmp_path_factory.mktemp("sglang-logs"), chat=True)
    release_after_last_use("sglang_url", server.stop)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def local_sglang(request, tmp_path_factory):
    """``local_sglang(name)``: ``(folder, server)`` of a real SGLang server on the local model
    ``name`` (``"qwen3-test"``, ``"llama3-test"``), shared by the test modules of the session
    (tests/support/sglang_servers.py::SharedServers) and stopped right after the last test that
    uses it (tests/support/last_use.py)."""
    from tests.support.last_use import release_after_last_use
    from tests.support.sglang_servers import SharedServers, require_sglang

    require_sglang()
    wanted = dict.fromkeys(
        name
        for item in request.session.items
        if "local_sglang" in getattr(item, "fixturenames", ())
        for name in getattr(getattr(item, "module", None), "SGLANG_MODELS", ())
    )
    servers = SharedServers(tmp_path_factory.mktemp("local-sglang"), wanted)
    release_after_last_use("local_sglang", servers.stop)
    try:
        yield servers
    finally:
        servers.stop()
