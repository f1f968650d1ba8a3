"""A .wf file is code (issue 12, item 19): `check` imports the modules a file names and so runs
them; `--no-import`, `--allow-import` and $SRPO_GRAPH_ALLOWED_IMPORTS limit that."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from srpo_graph.cli import app

WF = '''workflow w
import std
import sidefx as tools
policy p = "tiny"
agent a { policy: p prompt: "<a>" output: int via std.digit }
transition t { consume: a reward: tools.score(a) activate: end }
start: a
'''

MODULE = '''from pathlib import Path
Path(__file__).with_name("RAN").write_text("the module's code ran")

def score(x: int) -> float:
    return 1.0
'''


def _files(tmp_path: Path, module: str) -> Path:
    """The .wf file and its helper module (a fresh module name per test: imports are cached)."""
    (tmp_path / f"{module}.py").write_text(MODULE)
    (tmp_path / "w.wf").write_text(WF.replace("sidefx", module))
    return tmp_path / "w.wf"


def test_check_runs_the_code_of_imported_modules_and_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("SRPO_GRAPH_ALLOWED_IMPORTS", raising=False)
    wf = _files(tmp_path, "sidefx_default")
    r = CliRunner().invoke(app, ["check", str(wf)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "RAN").exists()
    help_text = CliRunner().invoke(app, ["check", "--help"]).output
    assert "A .wf file is code" in help_text and "--no-import" in help_text


def test_no_import_checks_everything_else_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("SRPO_GRAPH_ALLOWED_IMPORTS", raising=False)
    wf = _files(tmp_path, "sidefx_no_import")
    r = CliRunner().invoke(app, ["check", "--no-import", str(wf)])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "RAN").exists()
    assert "not imported: tools" in r.output
    broken = tmp_path / "broken.wf"  # everything but the module's functions is still checked
    broken.write_text(wf.read_text().replace("consume: a", "consume: nobody"))
    r = CliRunner().invoke(app, ["check", "--no-import", str(broken)])
    assert r.exit_code == 2 and "unknown agent 'nobody'" in r.output
    assert not (tmp_path / "RAN").exists()


def test_allowed_imports_refuse_other_modules_before_running_them(tmp_path, monkeypatch):
    wf = _files(tmp_path, "sidefx_allowed")
    r = CliRunner().invoke(app, ["check", "--allow-import", "other_tools", str(wf)])
    assert r.exit_code == 2 and "module 'sidefx_allowed' may not be imported (allowed: std, other_tools)" in r.output
    assert not (tmp_path / "RAN").exists()
    monkeypatch.setenv("SRPO_GRAPH_ALLOWED_IMPORTS", "pkg.*, other")
    r = CliRunner().invoke(app, ["check", str(wf)])  # the environment applies to every command
    assert r.exit_code == 2 and "may not be imported" in r.output and not (tmp_path / "RAN").exists()
    r = CliRunner().invoke(app, ["viz", str(wf), "-o", str(tmp_path / "g.dot")])
    assert r.exit_code == 2 and "may not be imported" in r.output and not (tmp_path / "RAN").exists()
    monkeypatch.setenv("SRPO_GRAPH_ALLOWED_IMPORTS", "sidefx_allowed")
    assert CliRunner().invoke(app, ["check", str(wf)]).exit_code == 0 and (tmp_path / "RAN").exists()
