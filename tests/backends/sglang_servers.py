"""Helpers of the real-SGLang tests: is SGLang here, start a real server on a free port.

Real servers only (shared/sglang-cpu's CPU recipe through srpo_graph.backends.sglang_server).
"""

from __future__ import annotations

import pytest


def _free_port(lo: int = 30010, hi: int = 30100, count: int = 2) -> int:
    """A port p in [lo, hi) with p .. p+count-1 free now, tried in random order (two test runs on
    one machine rarely pick the same one; a launched server binds it ~20 s later)."""
    import random
    import socket

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

    ports = list(range(lo, hi - count + 1))
    random.shuffle(ports)
    for port in ports:
        if all(free(port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no {count} free consecutive ports in {lo}..{hi}")


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
        return ("the real-SGLang tests are opt-in outside CI: set SRPO_GRAPH_SGLANG=1 to run them here "
                "(.ci/run sets SRPO_GRAPH_REQUIRE_SGLANG=1 after installing SGLang)")
    if not Path(sglang_python()).exists():
        return (f"SGLang is not installed ({sglang_python()} does not exist; set SRPO_GRAPH_SGLANG_PYTHON or run "
                "../shared/sglang-cpu/install.sh, as .ci/run does)")
    return None


def start_real_server(model_dir, log_dir, port: int | None = None):
    """A real SGLang server (CPU recipe) on ``model_dir``; the caller stops it."""
    from srpo_graph.backends.sglang_server import start_server

    port = port or _free_port()
    return start_server(str(model_dir), port, recipe="cpu", log_path=log_dir / f"sglang-{port}.log")




def require_sglang() -> None:
    """Skip (or, under SRPO_GRAPH_REQUIRE_SGLANG, fail) a test that starts its own servers."""
    import os

    why = sglang_unavailable() or (
        "this test starts its own servers; SRPO_GRAPH_SGLANG_URL names a server elsewhere"
        if os.environ.get("SRPO_GRAPH_SGLANG_URL") else None)
    if why:
        if os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG") and not os.environ.get("SRPO_GRAPH_SGLANG_URL"):
            pytest.fail(f"SRPO_GRAPH_REQUIRE_SGLANG is set but {why}")
        pytest.skip(why)
