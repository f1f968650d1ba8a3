"""The cpu recipe's entry point: ``python -m sglang.launch_server``, its processes forked.

Backends stage. Run by the SGLang venv's python (``sglang_server.CPU_TEMPLATE``), never imported
by srpo-graph: it needs only the standard library and SGLang, and does nothing on import.

Note [The cpu recipe forks SGLang's processes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
SGLang's launcher imports its HTTP server, engine and torch (~7-8 CPU-s on one core), then starts
the scheduler and the detokenizer with multiprocessing's ``spawn``
(``sglang.srt.entrypoints.engine._set_envs_and_config``: ``mp.set_start_method("spawn",
force=True)``), so each of them is a new interpreter that imports the same modules again. Spawn is
there for CUDA, which a forked child cannot use once its parent initialised it; the CPU engine has
no such state. This entry point runs ``sglang.launch_server`` as ``__main__`` with that one call
turned into ``fork``: the two processes start from the launcher's imported modules. Measured with
``benchmarks/bench_sglang_start.py`` (docs/performance.md, ``sglang-start``): a start on the tiny
model, launch to a healthy ``/health``, 17.1 -> 10.7 s and 22.7 -> 9.5 CPU-s of the server's
processes (medians of three, 2-core EPYC); the real-SGLang tests start ~16 servers a CI run.

Why a fork is safe at that point: the launcher has run no torch operation yet (no OpenMP pool
exists), its one zmq context is not used by the children (each makes its own, as under spawn), and
the only other threads are OpenBLAS's idle pools (numpy's and scipy's), which OpenBLAS itself
stops before a fork (``pthread_atfork``) and starts again on demand. Every other start method
request (a ``get_context("spawn")`` of a GPU-only feature) is left as it is, and the ``gpu``
recipe and every template run SGLang's own entry point: a template of
``{python} -m sglang.launch_server ...`` is the cpu recipe's flags with SGLang's spawn.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, and its sglang.py, transformers.py
# and openai.py would be imported in place of the real packages: drop it before importing anything.
_HERE = os.path.dirname(os.path.realpath(__file__))
if __name__ == "__main__" and sys.path and os.path.realpath(sys.path[0] or ".") == _HERE:
    del sys.path[0]

import multiprocessing  # noqa: E402
import runpy  # noqa: E402

_set_start_method = multiprocessing.set_start_method


def set_start_method(method: str | None, force: bool = False) -> None:
    """``multiprocessing.set_start_method``, with SGLang's ``"spawn"`` turned into ``"fork"``."""
    _set_start_method("fork" if method == "spawn" else method, force=force)


def main(argv: list[str]) -> None:
    """Run ``sglang.launch_server`` with ``argv`` (its own command-line arguments) as ``__main__``."""
    multiprocessing.set_start_method = set_start_method
    sys.argv = ["sglang.launch_server", *argv]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
