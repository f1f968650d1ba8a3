"""The two lanes (README.md, Development): `scripts/test.sh --fast` leaves out exactly the marks of
tests/support/lanes.py, each registered in pyproject.toml, and an unmarked test that starts a
Python process fails, naming the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lanes import LANE_MARKS, guard_processes

ROOT = Path(__file__).resolve().parents[1]


def test_the_fast_lane_leaves_out_the_registered_lane_marks():
    script = (ROOT / "scripts" / "test.sh").read_text()
    (expr,) = re.findall(r'fast=\(-m "([^"]+)"\)', script)
    assert sorted(re.findall(r"not (\w+)", expr)) == sorted(LANE_MARKS)
    markers = (ROOT / "pyproject.toml").read_text().split("markers = [", 1)[1].split("]", 1)[0]
    assert set(LANE_MARKS) <= set(re.findall(r'^\s*"(\w+):', markers, re.M))


@pytest.mark.proc  # it starts one on purpose, inside its own guard
def test_an_unmarked_python_process_fails_the_test_and_names_the_fix():
    with pytest.raises(pytest.fail.Exception, match=r"x::t starts a Python process .* add @pytest.mark.proc"):
        with guard_processes("x::t"):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    with guard_processes("x::t"):  # a shell for a moment is not a lane's worth of time
        subprocess.run(["bash", "-c", "true"], check=True)
