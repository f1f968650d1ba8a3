"""A NON-editable install works: the wheel ships the grammar and ``srpo-graph check`` loads it.

Real build, real install: the source tree is copied to a temporary directory (so the build
leaves no ``build/`` or ``*.egg-info`` in the checkout and no stale ``build/lib`` leaks into the
wheel), a wheel is built from the copy with pip, and installed with ``--no-deps`` into a fresh
venv that sees the system's site-packages for the dependencies. The commands then run from a
directory outside the checkout, so only the venv's copy of ``srpo_graph`` can be imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SKIP = shutil.ignore_patterns(".git", "build", "dist", "runs", ".venv", "out", "__pycache__", "*.egg-info",
                               ".hypothesis", ".pytest_cache", "tests", "benchmarks", "docs", "workflows")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def _has_local_setuptools() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


@pytest.mark.slow
def test_wheel_install_checks_from_another_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP, symlinks=True)
    isolation = ["--no-build-isolation"] if _has_local_setuptools() else []  # else pip fetches setuptools
    built = _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", *isolation, "-q",
                  "-w", str(tmp_path / "dist")], tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("srpo_graph-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert "srpo_graph/grammar/workflow.lark" in z.namelist()

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    # the system's pip, run by the venv's interpreter, installs into the venv; --force-reinstall
    # because the system already has srpo-graph 0.1.0 (editable), which pip would otherwise keep
    inst = _run([str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q",
                 "--disable-pip-version-check", str(wheel)], tmp_path)
    assert inst.returncode == 0, inst.stdout + inst.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(py), "-c", "import srpo_graph.lang.parser as p;"
                  "from importlib import resources as r;"
                  "print(p.__file__); print(r.files('srpo_graph').joinpath('grammar/workflow.lark'))"], elsewhere)
    assert where.returncode == 0, where.stderr
    parser_file, grammar_file = (Path(x) for x in where.stdout.split())
    assert parser_file.is_relative_to(venv), parser_file  # the installed copy, not the checkout
    assert grammar_file.is_relative_to(venv) and grammar_file.is_file() and not grammar_file.is_symlink()

    wf = ROOT / "workflows" / "coord_seq.wf"
    check = _run([str(venv / "bin" / "srpo-graph"), "check", str(wf)], elsewhere)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "hand_off  consumes a  set size 1  -> b" in check.stdout
    bad = elsewhere / "bad.wf"
    bad.write_text("workflow w\nagent a { policy tiny }\n", encoding="utf-8")
    rejected = _run([str(venv / "bin" / "srpo-graph"), "check", str(bad)], elsewhere)
    assert rejected.returncode == 2 and "missing ':' after a field name" in rejected.stderr, rejected.stderr
