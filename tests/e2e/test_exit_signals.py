"""A signal that arrives while a command exits keeps its outcome and prints no traceback (exiting.py).

The failure this guards: a rank of a torchrun job whose peer died prints its stop line and exits;
torchrun's SIGTERM to it lands inside the exit (there: a weakref callback) and Python printed
"Exception ignored in ... Traceback ... KeyboardInterrupt". Here the exit is made slow on purpose
with a real ``atexit`` function (it writes a marker, then sleeps), and real signals are sent to the
real entry points while it runs: ``srpo-graph`` (cli.main) and ``python -m srpo_graph.train``
(what torchrun runs).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WF = str(ROOT / "workflows" / "coord_seq.wf")

_SLOW_EXIT = """
import atexit, pathlib, sys, time
marker, seconds = pathlib.Path(sys.argv.pop(1)), float(sys.argv.pop(1))
def _slow_exit():
    marker.write_text("exiting")
    time.sleep(seconds)
atexit.register(_slow_exit)
"""

_AS_CLI = _SLOW_EXIT + """
sys.argv[0] = "srpo-graph"
import srpo_graph.cli as cli
cli.main(sys.argv[1:])
"""

_AS_TORCHRUN_WORKER = _SLOW_EXIT + """
import runpy
sys.argv[0] = "srpo_graph.train"
runpy.run_module("srpo_graph.train", run_name="__main__", alter_sys=True)
"""


def _start(code: str, marker: Path, sleep_s: float, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code, str(marker), str(sleep_s), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _signal_during_exit(proc: subprocess.Popen, marker: Path, *signals: int) -> str:
    """Send ``signals`` once the process has begun its slow exit (it writes ``marker``); its stderr."""
    wait_for(marker.exists, proc=proc, what="the slow exit")  # however long the start takes here
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.2)
    try:  # a slow exit that no signal ends sleeps an hour: this bound tells the two apart
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"signals {signals} did not end the slow exit")
    return err


@pytest.mark.proc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_clis_exit_keeps_the_status_and_prints_no_traceback(tmp_path, sig):
    proc = _start(_AS_CLI, tmp_path / "marker", 2.0, "check", WF)
    err = _signal_during_exit(proc, tmp_path / "marker", sig)
    assert proc.returncode == 0, err[-2000:]  # `check` passed: its status, not the signal's
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]


@pytest.mark.proc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_train_workers_exit_keeps_the_status_and_prints_no_traceback(tmp_path, sig):
    """The torchrun worker's entry point; the run stops on a bad override (a ConfigError, exit 7)
    after ``train`` has installed its SIGTERM handler (which raises KeyboardInterrupt)."""
    proc = _start(_AS_TORCHRUN_WORKER, tmp_path / "marker", 2.0, WF, "optim.lr=fast", "--run-dir",
                  str(tmp_path / "run"))
    err = _signal_during_exit(proc, tmp_path / "marker", sig)
    assert proc.returncode == 7, err[-2000:]
    assert "optim.lr" in err and "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]


@pytest.mark.proc
@pytest.mark.parametrize("code", [_AS_CLI, _AS_TORCHRUN_WORKER], ids=["cli", "torchrun-worker"])
def test_a_second_signal_ends_a_slow_exit_at_once(tmp_path, code):
    args = ("check", WF) if code is _AS_CLI else (WF, "--steps", "1", "--run-dir", str(tmp_path / "run"))
    proc = _start(code, tmp_path / "marker", 3600.0, *args)  # an exit no one waits out
    err = _signal_during_exit(proc, tmp_path / "marker", signal.SIGTERM, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err, err[-2000:]


def test_in_process_the_outcome_puts_the_callers_sigterm_handler_back():
    """In-process (a test's CliRunner, a notebook), ``decided`` changes nothing the caller owns: the
    SIGTERM handler ``stop_on_sigterm`` replaced is put back, SIGINT is left alone."""
    from srpo_graph import exiting
    from srpo_graph.train import commands
    def callers(signum, frame):  # noqa: ARG001
        raise RuntimeError("the caller's handler")

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGTERM, callers)
        exiting.stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        assert commands._interrupt_code() == 143 and "SIGTERM" in commands._interrupt_name()
        exiting.decided()
        assert signal.getsignal(signal.SIGTERM) is callers and signal.getsignal(signal.SIGINT) is before[1]
    finally:
        signal.signal(signal.SIGTERM, before[0])
        exiting._STOPS.clear()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception, on purpose
def test_a_sigterm_swallowed_by_a_finalizer_still_stops_the_run():
    """Python prints and drops an exception raised inside a finalizer; the training loop's check
    (``raise_if_stopped``, once per step) raises it again. The signal is real; the finalizer is a
    real weakref callback run by a real collection."""
    import gc
    import weakref

    from srpo_graph import exiting

    class Held:
        pass

    before = signal.getsignal(signal.SIGTERM)
    try:
        exiting.stop_on_sigterm()
        exiting.raise_if_stopped()  # nothing yet

        def _callback(_ref):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, inside the callback; Python drops its exception
                sum(range(10))

        obj = Held()
        ref = weakref.ref(obj, _callback)
        del obj
        gc.collect()
        assert ref() is None and exiting.stopped_by() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            exiting.raise_if_stopped()
    finally:
        signal.signal(signal.SIGTERM, before)
        exiting._STOPS.clear()
