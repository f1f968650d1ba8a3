"""The ``srpo-graph`` command in process (click's ``CliRunner``), for tests whose subject is an exit
status or a message: no interpreter and torch import per call, as a subprocess costs (issue 35).
A subprocess stays where a signal, a process death, a lock between processes or torchrun is the
subject."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result


def invoke(*args: Any, cwd: str | Path | None = None) -> Result:
    """Run ``srpo-graph ARGS`` in this process and return click's result (``exit_code``, ``stdout``,
    ``stderr``). An exception that escaped the command (the user would have seen a traceback) is
    re-raised, so the test fails on it rather than reading an exit status of 1."""
    from srpo_graph.cli import app

    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result
