"""The fast lane's rule, checked while the tests run: a test that starts a Python process carries a
mark that keeps it out of ``scripts/test.sh --fast``.

The fast lane (``-m "not slow and not sglang and not proc"``) is the edit-test loop; each Python
process a test starts costs 5-10 s of imports on a 2-core machine, so such a test is marked
``proc`` (or ``slow`` / ``sglang``, which the lane leaves out too). :func:`guard_processes` wraps
``subprocess.Popen`` for one unmarked test and fails it, naming the command and the fix, when it
starts python, the ``srpo-graph`` console script, torchrun, node or npm. (Processes started by a
module- or session-scoped fixture before the test are not seen: such fixtures' tests are marked
by hand.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LANE_MARKS = ("slow", "sglang", "proc")  # what `scripts/test.sh --fast` leaves out
_HEAVY = re.compile(r"(?:^|/)(?:python[\d.]*|srpo-graph|torchrun|node|npm|npx)$")


def is_heavy(args, executable=None) -> bool:
    """Whether a ``Popen(args, executable=...)`` starts a Python (or node) process.

    >>> is_heavy([sys.executable, "-c", "pass"]), is_heavy(["srpo-graph", "train"]), is_heavy("bash -c true")
    (True, True, False)
    """
    if executable is not None:
        first = os.fspath(executable)
    elif isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(os.fspath(args))
        first = text.split()[0] if text.split() else ""
    else:
        first = os.fsdecode(os.fspath(list(args)[0])) if list(args) else ""
    return first == sys.executable or bool(_HEAVY.search(first))


@contextmanager
def guard_processes(test_id: str) -> Iterator[None]:
    """Inside: a ``subprocess.Popen`` of a Python process fails the test (see the module docstring)."""
    real_init = subprocess.Popen.__init__
    started: list[str] = []

    def init(self, args, *a, **kw):
        real_init(self, args, *a, **kw)  # (a command that cannot start raises here: no process, no mark needed)
        if is_heavy(args, kw.get("executable")):
            started.append(str(args)[:200])

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
    if started:
        import pytest

        pytest.fail(
            f"{test_id} starts a Python process ({started[0]}) but is not marked: add @pytest.mark.proc "
            f"(or slow / sglang) so that `bash scripts/test.sh --fast` leaves it out (README.md, Development)",
            pytrace=False,
        )
