"""Helpers of the real-SGLang tests: is SGLang here, start a real server on a free port.

Real servers only (shared/sglang-cpu's CPU recipe through srpo_graph.backends.sglang_server).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def sglang_unavailable() -> str | None:
    """Why a real SGLang server cannot be started here (None: it can).

    CI (.ci/run) sets SRPO_GRAPH_REQUIRE_SGLANG=1 after installing SGLang, and then a server that
    cannot start is a test failure, never a skip.
    """
    import os
    from pathlib import Path

    from srpo_graph.backends.sglang_server import sglang_python

    if os.environ.get("SRPO_GRAPH_SGLANG_URL"):
        return None
    if not (os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG") or os.environ.get("SRPO_GRAPH_SGLANG") == "1"):
        # they start ~10 real servers (~10 min on 2 shared cores): CI runs them, a developer opts in
        return (
            "the real-SGLang tests are opt-in outside CI: set SRPO_GRAPH_SGLANG=1 to run them here "
            "(.ci/run sets SRPO_GRAPH_REQUIRE_SGLANG=1 after installing SGLang)"
        )
    if not Path(sglang_python()).exists():
        return (
            f"SGLang is not installed ({sglang_python()} does not exist; set SRPO_GRAPH_SGLANG_PYTHON or run "
            "../shared/sglang-cpu/install.sh, as .ci/run does)"
        )
    return None


def start_real_server(model_dir, log_dir, port: int | None = None):
    """A real SGLang server (CPU recipe) on ``model_dir``; the caller stops it."""
    from srpo_graph.backends.ports import claim_ports
    from srpo_graph.backends.sglang_server import start_server

    port = port or claim_ports(1)[0]
    return start_server(str(model_dir), port, recipe="cpu", log_path=log_dir / f"sglang-{port}.log")


ROOT = Path(__file__).resolve().parents[2]
# what workflows/tinymath_external_verifier.wf's comment adds to the cpu preset for an OpenAI chat
# endpoint: a raw chat template (the tiny tokenizer has none) and OpenAI sampling defaults (the
# tiny model's generation_config has top_k 0, which SGLang's OpenAI route refuses)
CHAT_FLAGS = f" --chat-template {ROOT / 'workflows' / 'chat_templates' / 'raw.jinja'} --sampling-defaults openai"


def start_real_servers(model_dirs, log_dir, health_timeout: float = 300.0, chat: bool = False) -> list:
    """Real SGLang servers (CPU recipe), one per entry of ``model_dirs``, started together and then
    each waited for, as training's ``serve_policies`` does: their ~30 s start-ups overlap instead
    of adding up. ``chat``: with :data:`CHAT_FLAGS`. The caller stops them (:func:`stop_servers`);
    on a failure to start, none is left running."""
    from srpo_graph.backends.ports import claim_ports
    from srpo_graph.backends.sglang_server import CPU_TEMPLATE, SGLangServer, launch_command, recipe_env

    servers: list = []
    try:
        for model_dir, port in zip(model_dirs, claim_ports(len(model_dirs))):
            servers.append(
                SGLangServer(
                    launch_command(CPU_TEMPLATE + CHAT_FLAGS if chat else "cpu", str(model_dir), port),
                    port,
                    log_path=log_dir / f"sglang-{port}.log",
                    env=recipe_env("cpu"),
                ).start()
            )
        for server in servers:
            server.wait_healthy(health_timeout)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers) -> None:
    """Stop servers together (each stop waits for its process group, ~5 s for SGLang's shutdown)."""
    import threading

    threads = [threading.Thread(target=s.stop) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class SharedServers:
    """The session's real SGLang servers of the locally built models (``ensure_local_model``: the
    Qwen3- and Llama 3-shaped ``*-test`` models), one per model, shared by every test module that
    only reads them (tests/backends/conftest.py's ``local_sglang``): a server start is 20-30 s of a
    2-core CI run, and the modules used to start one each. The first request starts every model
    that a collected test module names in its ``SGLANG_MODELS`` together (their start-ups overlap).

    A module that changes a shared server's weights puts them back before it ends (as
    test_sglang_chat.py does); a test that kills, stalls or restarts its server starts its own.
    """

    def __init__(self, root, wanted=()) -> None:
        self.root = root
        self.wanted = tuple(wanted)
        self.served: dict = {}

    def __call__(self, name: str):
        """``(model folder, its running server)`` of the local model ``name``."""
        from srpo_graph.models.architectures import ensure_local_model

        if name not in self.served:
            names = [name, *(n for n in self.wanted if n != name and n not in self.served)]
            paths = [ensure_local_model(n, self.root / n) for n in names]
            servers = start_real_servers(paths, self.root)
            self.served.update(zip(names, zip(paths, servers)))
        path, server = self.served[name]
        assert server.alive(), f"the shared SGLang server of {name} is gone (its log: {self.root})"
        return path, server

    def stop(self) -> None:
        """Stop every server (idempotent)."""
        servers = [server for _, server in self.served.values()]
        stop_servers(servers)
        self.served.clear()
        assert not any(server.alive() for server in servers)


def require_sglang() -> None:
    """Skip (or, under SRPO_GRAPH_REQUIRE_SGLANG, fail) a test that starts its own servers."""
    import os

    why = sglang_unavailable() or (
        "this test starts its own servers; SRPO_GRAPH_SGLANG_URL names a server elsewhere"
        if os.environ.get("SRPO_GRAPH_SGLANG_URL")
        else None
    )
    if why:
        if os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG") and not os.environ.get("SRPO_GRAPH_SGLANG_URL"):
            pytest.fail(f"SRPO_GRAPH_REQUIRE_SGLANG is set but {why}")
        pytest.skip(why)


def reset_weights(url: str, model_dir, weight_dir) -> None:
    """Put ``model_dir``'s weights on the server at ``url`` at version 0, generation not paused and
    its cache flushed -- the backend's own calls (``continue_generation``, ``sync_weights`` with a
    folder): the session server as it was launched, before and after a test whose run trains into it
    (tests/backends/conftest.py::trainable_sglang). ``weight_dir``: the backend's (unused by a folder)."""
    from tests.support.sglang_checks import client

    backend = client(url, model_dir, sync="disk", weight_dir=weight_dir)
    try:
        backend.continue_generation()  # (a run stopped in a partial sync leaves the server paused)
        backend.sync_weights(model_dir, 0)
    finally:
        backend.close()
