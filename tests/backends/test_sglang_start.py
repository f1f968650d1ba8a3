"""Every way an SGLang server can fail to start is named, with the fix (issue 39, item 2).

Real processes and real faults: the launch templates below are real commands started through
``start_server`` (the same path a run takes) that die of a real signal, fail to bind a port that
is really taken, or leave a child behind; the missing venv is a real missing file. The one
real-SGLang case (a model folder it cannot load) needs the server and is marked ``sglang``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import socket
import sys
import time

import pytest

from srpo_graph.backends.ports import claim_ports
from srpo_graph.backends.sglang_server import start_server
from srpo_graph.backends.sglang_start import diagnose, signal_of
from srpo_graph.errors import BackendError

PY = shlex.quote(sys.executable)


def _start(tmp_path, code: str, health_timeout: float = 60.0):
    """``start_server`` on a real python process running ``code`` (its argv carries {model} {port})."""
    (tmp_path / "die.py").write_text(code)
    recipe = f"{PY} {shlex.quote(str(tmp_path / 'die.py'))} {{model}} {{port}}"
    with pytest.raises(BackendError) as info:
        start_server(str(tmp_path), 1, recipe=recipe, log_path=tmp_path / "server.log", health_timeout=health_timeout)
    return str(info.value)


@pytest.mark.parametrize("sig, words", [
    ("SIGILL", ["SIGILL", "instructions this CPU lacks", "install.sh"]),
    ("SIGKILL", ["SIGKILL", "out-of-memory"]),
    ("SIGSEGV", ["SIGSEGV", "native code"]),
    ("SIGBUS", ["SIGBUS", "/dev/shm"]),
])
@pytest.mark.proc  # a stand-in server process (die.py)
def test_a_server_killed_by_a_signal_while_starting_names_the_signal_and_the_fix(tmp_path, sig, words):
    message = _start(tmp_path, "import os, signal, sys\n"
                               "print('UserWarning: something unrelated', flush=True)\n"
                               f"os.kill(os.getpid(), signal.{sig})\n")
    for word in words:
        assert word in message, message
    assert "UserWarning: something unrelated" in message  # the log's last lines come with it
    assert "fix:" in message


@pytest.mark.proc  # a stand-in server process (die.py)
def test_a_port_taken_under_the_server_is_named(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        message = _start(tmp_path, f"import socket\nsocket.socket().bind(('127.0.0.1', {port}))\n")
    assert "port is already taken" in message and "rollout.sglang.port" in message, message


@pytest.mark.proc  # a stand-in server process (die.py)
def test_sglang_missing_in_the_servers_python_is_named(tmp_path):
    """This test environment's python has no SGLang (the server's venv does): a real failed import."""
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("this python has SGLang")
    message = _start(tmp_path, "import sglang\n")
    assert "SGLang is not importable" in message and "SRPO_GRAPH_SGLANG_PYTHON" in message, message


def test_a_missing_sglang_venv_is_named_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SRPO_GRAPH_SGLANG_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(BackendError) as info:
        start_server(str(tmp_path), 1, recipe="cpu", log_path=tmp_path / "server.log")
    message = str(info.value)
    assert "does not exist" in message and "install.sh" in message and "no-venv" in message, message


def test_a_launch_command_that_is_not_executable_is_named(tmp_path):
    with pytest.raises(BackendError) as info:
        start_server(str(tmp_path), 1, recipe=f"{tmp_path}/nothing-here {{model}} {{port}}",
                     log_path=tmp_path / "server.log")
    assert "cannot execute" in str(info.value) and "rollout.sglang.launch" in str(info.value)


@pytest.mark.proc  # a stand-in server process (die.py)
def test_a_launcher_that_dies_takes_the_children_it_started_with_it(tmp_path):
    """SGLang's launcher forks its scheduler and detokenizer: a launcher that dies while starting
    must not leave them running (the whole process group is stopped)."""
    pid_file = tmp_path / "child.pid"
    _start(tmp_path, "import subprocess, sys, os\n"
                     "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                     f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
                     "os._exit(1)\n")
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init once orphaned: a zombie still answers kill(0) for a moment
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the launcher's child outlived it")


def test_the_classes_from_status_and_log():
    assert signal_of(-4) is signal.SIGILL and signal_of(132) is signal.SIGILL and signal_of(0) is None
    assert "instructions this CPU lacks" in diagnose(1, "Fatal Python error: Illegal instruction").what
    assert "cannot load the model" in diagnose(1, "OSError: /m does not appear to have a file named config.json").what
    assert "out of memory" in diagnose(1, "RuntimeError: Not enough memory. Please try to increase").what
    assert diagnose(-15, "").what == "killed by SIGTERM (exit status -15)"
    assert diagnose(2, "usage: ...").what == "exited with code 2"


@pytest.mark.sglang
def test_the_real_server_on_a_model_folder_it_cannot_load_says_so(tmp_path):
    from pathlib import Path

    from srpo_graph.backends.sglang_server import sglang_python
    from tests.support import sglang_servers as servers
    why = servers.sglang_unavailable()
    if why:
        if os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG"):
            pytest.fail(why)
        pytest.skip(why)
    assert Path(sglang_python()).exists()
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(BackendError) as info:
        start_server(str(empty), claim_ports(1)[0], recipe="cpu", log_path=tmp_path / "server.log",
                     health_timeout=240)
    assert "cannot load the model" in str(info.value), str(info.value)
