"""The editor's import deadline bounds the user's imports, not the child's own start (issue 39, item 5;
Note [The import deadline] in srpo_graph/lsp/imports.py). Real child processes: a real
``sitecustomize.py`` that makes the child's python start slowly (as a loaded machine does), and a real
module that is slow to import."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from srpo_graph.lang.checker import ImportPolicy
from srpo_graph.lsp.imports import check_in_child

ROOT = Path(__file__).resolve().parents[2]
WF = """workflow w
import std
import {module}
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  output: int via {module}.{function}
}}
transition t {{
  consume: a
  activate: end
}}
start: a
"""


@pytest.mark.proc  # the import check runs in a child process
def test_a_slow_start_does_not_count_against_the_import_deadline(tmp_path, monkeypatch):
    slow = tmp_path / "slow_start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(3)\n")  # every python started here waits 3 s
    monkeypatch.setenv("PYTHONPATH", str(slow))
    shutil.copy(ROOT / "tests/lang/golden/bad/sigtools.py", tmp_path / "sigtools.py")
    text = WF.format(module="sigtools", function="two_args")
    out = asyncio.run(check_in_child(text, str(tmp_path / "w.wf"), ImportPolicy(), timeout=1.0))
    assert out.diagnostics is not None, out.problem
    assert any(d.code == "bad-signature" for d in out.diagnostics)  # the module was imported and checked


@pytest.mark.proc  # the import check runs in a child process
def test_a_slow_import_is_still_stopped_at_the_deadline(tmp_path):
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(30)\n\n\ndef f(text: str) -> int:\n    return 1\n")
    text = WF.format(module="slowmod", function="f")
    out = asyncio.run(check_in_child(text, str(tmp_path / "w.wf"), ImportPolicy(), timeout=1.0))
    assert out.diagnostics is None and "took longer than 1 s" in out.problem
