"""Fixtures for the backend tests: the real tiny model, in a temporary directory (a copy:
tests/conftest.py::tiny_copy)."""

from __future__ import annotations

from pathlib import Path

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
    SESSION_LOGS[server.url] = server.log_path
    release_after_last_use("sglang_url", server.stop)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def trainable_sglang(sglang_url, tiny_dir, tmp_path):
    """``(url, log)``: the session server, for a test whose training run writes into it
    (``rollout.sglang.url=URL rollout.sglang.update_connected=true``) because what it tests is the
    training, not the launch (tests that launch their own: test_sglang_train.py, test_sglang_lora.py,
    test_sglang_eval.py, ...). A launch costs 20-50 s of CI time (docs/performance.md,
    "CI time"). The server holds ``tiny_dir``'s weights -- those of the workflows' policy ``tiny`` --
    at version 0 before the test and again after it, so the runs start as on a server of their own and
    the other users of ``sglang_url`` find the weights they expect. ``log``: the server's log, or
    None (an outside server, SRPO_GRAPH_SGLANG_URL)."""
    from tests.support.sglang_servers import reset_weights

    reset_weights(sglang_url, tiny_dir, tmp_path / "reset-weights")
    try:
        yield sglang_url, SESSION_LOGS.get(sglang_url)
    finally:
        reset_weights(sglang_url, tiny_dir, tmp_path / "reset-weights")


SESSION_LOGS: dict[str, Path] = {}  # the session server's url -> its log (sglang_url)


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
