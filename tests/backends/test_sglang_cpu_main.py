"""The cpu recipe's entry point, ``srpo_graph/backends/sglang_cpu_main.py`` (Note [The cpu recipe
forks SGLang's processes]): SGLang's launcher with its scheduler and detokenizer forked.

* the mapping itself, in the fast lane: a real interpreter runs the entry point on a stand-in
  ``sglang.launch_server`` (this python has no SGLang), which asks for ``spawn`` as SGLang's does;
* on the session's real server (``sglang_url``, launched by the cpu recipe): SGLang was imported by
  one interpreter, not three. Every other real-SGLang test runs its servers through this entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from srpo_graph.backends.sglang_server import CPU_MAIN, CPU_TEMPLATE

STAND_IN = """\
import json, multiprocessing as mp, sys
import sglang
mp.set_start_method("spawn", force=True)
print(json.dumps({"name": __name__, "argv": sys.argv[1:], "method": mp.get_start_method(),
                  "spawn_context": mp.get_context("spawn").get_start_method(),
                  "sglang": sglang.__file__}))
"""


@pytest.mark.proc  # a python process running the entry point
def test_the_entry_point_runs_sglang_launch_server_with_fork_where_it_asks_for_spawn(tmp_path):
    """A stand-in for SGLang's ``sglang.launch_server`` (this environment's python has no SGLang),
    run by a real interpreter through the real entry point: it runs as ``__main__`` with the
    arguments given, its ``set_start_method("spawn")`` becomes ``fork``, an explicit spawn context is
    still spawn, and ``import sglang`` finds the real package -- not ``srpo_graph/backends/sglang.py``
    beside the entry point, which a script's folder on ``sys.path`` would put first."""
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, str(CPU_MAIN), "--model-path", "m", "--port", "7"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    seen = json.loads(out)
    assert seen == {"name": "__main__", "argv": ["--model-path", "m", "--port", "7"], "method": "fork",
                    "spawn_context": "spawn", "sglang": str(package / "__init__.py")}, seen


def test_the_cpu_recipe_runs_the_entry_point_and_importing_it_runs_nothing():
    import srpo_graph.backends.sglang_cpu_main as entry

    assert CPU_TEMPLATE.startswith(f"{{python}} {CPU_MAIN} ") and entry.__file__ == str(CPU_MAIN)
    import multiprocessing

    assert multiprocessing.set_start_method is not entry.set_start_method  # patched only in main()


@pytest.mark.sglang
def test_the_session_server_imported_sglang_in_one_process(sglang_url):
    """SGLang warns once per interpreter that imports its quantization layers: spawned, the
    launcher, the scheduler and the detokenizer each printed it (3 times); forked, once."""
    from tests.backends.conftest import SESSION_LOGS

    if sglang_url not in SESSION_LOGS:
        pytest.skip("SRPO_GRAPH_SGLANG_URL names a server this session did not launch")
    log = SESSION_LOGS[sglang_url].read_text(errors="replace")
    warned = [line for line in log.splitlines() if "UserWarning: Only CUDA, HIP and XPU support AWQ" in line]
    assert len(warned) == 1, (len(warned), SESSION_LOGS[sglang_url])
