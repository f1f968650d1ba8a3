"""The suite's split over two pytest-xdist workers (tests/support/parallel.py): what a session's shared
server or reference run, or a module's fixture, is made by stays on one worker, so it is made once;
the rest is spread over both workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.parallel import SGLANG_GROUP, group_of

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = '''
import os
import time

import pytest

from tests.support.parallel import group_items

BUILDS = os.environ["BUILDS"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    group_items(items)


def _built(name):
    with open(BUILDS, "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")
    time.sleep(0.3)


@pytest.fixture(scope="session")
def sglang_url():
    _built("sglang_url")
    return "http://127.0.0.1:1"


@pytest.fixture(scope="session")
def one_process():
    _built("one_process")
    return "run"


@pytest.fixture
def worker():
    yield
    with open(BUILDS, "a") as f:
        f.write(f"ran {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")
'''

SERVED = '''
import pytest

@pytest.mark.parametrize("i", range(4))
def test_served(sglang_url, worker, i):
    assert sglang_url
'''

REFERENCE = '''
import pytest

@pytest.mark.parametrize("i", range(4))
def test_compared(one_process, worker, i):
    assert one_process
'''

MODULE = '''
import pytest

from conftest import _built


@pytest.fixture(scope="module")
def trained():
    _built("trained")
    return 1


@pytest.mark.parametrize("i", range(4))
def test_uses_trained(trained, worker, i):
    assert trained
'''

PLAIN = '''
import time

import pytest

@pytest.mark.parametrize("i", range(16))
def test_plain(worker, i):
    time.sleep(0.2)
'''


@pytest.mark.proc
def test_shared_fixtures_are_made_once_and_the_rest_spreads_over_both_workers(tmp_path):
    for name, text in {"conftest.py": CONFTEST, "test_a_served.py": SERVED, "test_b_served.py": SERVED,
                       "test_c_reference.py": REFERENCE, "test_d_module.py": MODULE,
                       "test_e_plain.py": PLAIN}.items():
        (tmp_path / name).write_text(text)
    builds = tmp_path / "builds.txt"
    env = {**os.environ, "BUILDS": str(builds),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "32 passed" in proc.stdout, proc.stdout[-2000:]
    lines = [ln.split() for ln in builds.read_text().splitlines()]
    made = sorted(name for name, _ in lines if name != "ran")
    assert made == ["one_process", "sglang_url", "trained"], lines  # each once, though 8/4/4 tests use them
    assert {w for name, w in lines if name == "ran"} == {"gw0", "gw1"}  # and the plain tests used both workers


def test_the_group_of_an_item_follows_the_fixtures_it_needs():
    class Info:
        def __init__(self, scopes):
            self.names_closure = list(scopes)
            self.name2fixturedefs = {n: [type("Def", (), {"scope": s})()] for n, s in scopes.items()}

    class Item:
        def __init__(self, nodeid, scopes):
            self.nodeid, self.fixturenames, self._fixtureinfo = nodeid, list(scopes), Info(scopes)

    assert group_of(Item("tests/a.py::t", {"sglang_url": "session", "tmp_path": "function"})) == SGLANG_GROUP
    assert group_of(Item("tests/a.py::t", {"local_sglang": "session"})) == SGLANG_GROUP
    assert group_of(Item("tests/b.py::t", {"one_process": "session"})) == "one-process"
    assert group_of(Item("tests/c.py::t[1]", {"trained": "module"})) == "tests/c.py"
    assert group_of(Item("tests/d.py::t", {"tmp_path": "function", "tiny_copy": "session"})) is None
