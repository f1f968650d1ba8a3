"""A process that joined a process group, or that still has a daemon thread at its end, ends with the
status it decided, without the interpreter's finalization (srpo_graph/exiting.py, Notes [A process
in a group ends without finalizing] and [A daemon thread at finalization]): its ``atexit``
functions still run and its output is flushed; any other process exits as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph import exiting

ROOT = Path(__file__).resolve().parents[1]

# A real gloo group of one, kept alive past the end (as a captured default or an exception's frames
# would keep it), and a non-daemon thread: the part of finalization that must be skipped -- Python
# joins such a thread before it finalizes, so an exit through finalization never ends.
CHILD = r"""
import atexit, sys, threading, time
from datetime import timedelta

import torch.distributed as dist

from srpo_graph import exiting

exiting.as_entry_point()
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30))
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
HOLD = [dist.group.WORLD]
if sys.argv[1] == "joined":
    exiting.joined_process_group()
atexit.register(lambda: open(sys.argv[2], "w").write("atexit ran"))
threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
sys.stdout.write("decided, not yet flushed")
exiting.end(3)
print(" -- end() returned: this process never joined a group", flush=True)
import os
os._exit(4)  # (the test's own way out: a plain exit would wait for the thread)
"""


@pytest.mark.proc
@pytest.mark.parametrize("joined", [True, False])
def test_a_process_in_a_group_ends_with_its_status_and_runs_its_atexit_functions(tmp_path, joined):
    marker = tmp_path / "atexit.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHILD, "joined" if joined else "alone", str(marker)],
                          capture_output=True, text=True, timeout=120, env=env)
    if joined:
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert proc.stdout == "decided, not yet flushed"  # flushed by end()
        assert marker.read_text() == "atexit ran"  # the atexit functions ran (server stops, temporary folders)
    else:  # end() is a no-op: the caller goes on to exit as usual
        assert proc.returncode == 4 and proc.stdout.endswith("never joined a group\n"), proc.stderr[-2000:]
        assert not marker.exists()


def test_end_never_ends_the_callers_process_in_process(monkeypatch):
    """In a test or a notebook (no command's entry point), end() returns even after a group was joined."""
    monkeypatch.setattr(exiting, "_GROUPS", [True])
    monkeypatch.setattr(exiting, "_ENTRY", [])
    exiting.end(5)  # still here
    assert not exiting.ends_without_finalizing()  # (a joined group does not make it a command's process)


# A daemon thread inside pydantic-core (Rust) calling a Python validator that keeps computing: the
# way a reward abandoned at its deadline, or the language server's warm-up, is left at the end.
DAEMON_CHILD = r"""
import atexit, sys, threading, time

from pydantic import BaseModel, field_validator

from srpo_graph import exiting


class Checked(BaseModel):
    value: int

    @field_validator("value")
    @classmethod
    def slow(cls, v):
        started.set()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            v = (v * 31 + 7) % 1_000_003
        return v


started = threading.Event()
exiting.as_entry_point()
atexit.register(lambda: open(sys.argv[2], "w").write("atexit ran"))
if sys.argv[1] == "daemon":
    threading.Thread(target=Checked, kwargs={"value": 1}, daemon=True).start()
    started.wait(30)
# a non-daemon thread still working: joined before the end, as the interpreter's exit joins it
threading.Thread(target=lambda: (time.sleep(0.5), open(sys.argv[2] + ".joined", "w").close())).start()
sys.stdout.write("decided, not yet flushed")
exiting.end(3)
sys.exit(4)  # (the interpreter's own exit, through its finalization)
"""


@pytest.mark.proc
@pytest.mark.parametrize("thread", ["daemon", "none"])
def test_a_command_with_a_daemon_thread_inside_an_extension_ends_with_its_status(tmp_path, thread):
    """Finalizing would unwind the daemon thread through pydantic-core's frames and abort ("FATAL:
    exception not rethrown", 134); end() joins the non-daemon threads and takes the way without
    finalization instead. With no daemon thread left, end() returns and the process finalizes as
    before."""
    marker = tmp_path / "atexit.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", DAEMON_CHILD, thread, str(marker)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == (3 if thread == "daemon" else 4), proc.stderr[-2000:]
    assert proc.stdout == "decided, not yet flushed" and not proc.stderr
    assert marker.read_text() == "atexit ran"
    assert marker.with_name(marker.name + ".joined").exists()  # the non-daemon thread finished its work
