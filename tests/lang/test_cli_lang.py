"""The lang CLI as a user runs it: one real subprocess (the entry point), the rest in process
(tests/support/cli.py: the same command, without an interpreter start per call)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "srpo_graph.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _in(*args: str):
    return invoke(*args, cwd=ROOT)


@pytest.mark.proc
def test_check_ok_and_bad_file() -> None:
    ok = _run("check", "workflows/coord_seq.wf")
    assert ok.returncode == 0, ok.stderr
    assert "hand_off  consumes a  set size 1  -> b" in ok.stdout
    bad = _run("check", "tests/lang/golden/bad/unbounded_cycle.wf")
    assert bad.returncode == 2
    assert "tests/lang/golden/bad/unbounded_cycle.wf:15:12: error: unbounded cycle" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_fmt_check_and_viz(tmp_path: Path) -> None:
    assert _in("fmt", "--check", "workflows/coord_seq.wf").exit_code == 0
    messy = tmp_path / "m.wf"
    messy.write_text((ROOT / "workflows/coord_seq.wf").read_text().replace("  policy: tiny", "policy:tiny"))
    assert _in("fmt", "--check", str(messy)).exit_code == 1
    assert _in("fmt", "--write", str(messy)).exit_code == 0
    assert messy.read_text() == (ROOT / "workflows/coord_seq.wf").read_text()
    out = tmp_path / "g.mmd"
    r = _in("viz", "workflows/coord_mixed.wf", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    assert out.read_text().startswith("flowchart TD")


def test_check_prints_tight_bounds_and_separates_workflows() -> None:
    # coord_routed: dispatch, then ONE of done_a/b/c -> 2 firings (not 4: a router takes one case);
    # coord_mixed: pair, then close -> 2; search has a bounded cycle -> max_steps
    r = _in("check", "workflows/coord_routed.wf", "workflows/coord_mixed.wf", "workflows/search.wf")
    assert r.exit_code == 0, r.stderr
    blocks = r.stdout.split("\n\n")
    assert len(blocks) == 3
    assert "at most 2 transition firings (the graph is acyclic)" in blocks[0]
    assert "at most 2 transition firings (the graph is acyclic)" in blocks[1]
    assert "(max_steps; the graph has bounded cycles)" in blocks[2]


def test_check_json_saves_the_typed_workflow(tmp_path: Path) -> None:
    from srpo_graph.lang import load_workflow
    from srpo_graph.workflow import Workflow

    proc = _in("check", str(ROOT / "workflows" / "coord_routed.wf"), "--json", str(tmp_path / "specs"))
    assert proc.exit_code == 0, proc.stderr
    saved = Workflow.model_validate_json((tmp_path / "specs" / "coord_routed.json").read_text(encoding="utf-8"))
    assert saved == load_workflow(ROOT / "workflows" / "coord_routed.wf")
