"""One ownership rule for every path that writes or deletes in ``rollout.sglang.weight_dir``
(issue 23, item 2; issue 40, item 8; ``backends/weight_dir.py``, ``backends/weight_lease.py``):
the full-model sync and the LoRA adapter sync.

* the LoRA sync never deletes or replaces a user's ``v0..v2`` (before: it deleted them);
* two runs on one weight folder: while run A holds its lease (a real second process that wrote
  its ``v0`` through the same code, its heartbeat renewed past several expiries), run B --
  full-model or LoRA -- is refused at its first write, naming the folder and A; A's versions are
  intact; once A is killed and its heartbeat expires, B takes over and adopts the folder;
* the lease, not a PID: a second owner in the same process is refused; a lease of another host with
  a fresh heartbeat (a real file) is refused, an expired one taken over with one line; a clean
  close releases it; a holder whose lease was taken over refuses its next write;
* a resumed run (same run folder, another process) is the same owner.
The HTTP side is not involved (the fake server of the client tests answers the LoRA calls); the
files, the lease and the processes are real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srpo_graph.backends.sglang import SGLangBackend
from srpo_graph.backends.sglang_lora import SGLangAdapterBackend
from srpo_graph.backends.weight_dir import MANIFEST, WeightFolder, run_owner
from srpo_graph.backends.weight_lease import LEASE, WeightFolderError
from srpo_graph.errors import BackendError

ROOT = Path(__file__).resolve().parents[2]


class _Saved:
    def save_pretrained(self, path, **kw):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x")


def _lora(root: Path, owner: str | None = None):
    b = SGLangAdapterBackend("http://127.0.0.1:9", None, adapter="solver", check_health=False, weight_dir=root,
                             vocab_size=73, weight_owner=owner)
    b._post = lambda base, route, body, **kw: {"success": True}
    return b


def test_the_lora_sync_never_touches_a_users_folders(tmp_path):
    root = tmp_path / "w"
    for name in ("v0", "v1", "v2"):
        (root / name).mkdir(parents=True)
        (root / name / "mine.txt").write_text(name)
    b = _lora(root)
    with pytest.raises(BackendError, match="v0: error: exists and was not written by srpo-graph"):
        b.sync_weights(_Saved(), 0)
    b.sync_weights(_Saved(), 3)
    b.sync_weights(_Saved(), 4)  # v3 (ours) goes; v0..v2 (the user's) stay
    assert sorted(p.name for p in root.iterdir()) == [LEASE, MANIFEST, "v0", "v1", "v2", "v4"]
    assert all((root / n / "mine.txt").read_text() == n for n in ("v0", "v1", "v2"))


@pytest.fixture
def run_a(tmp_path):
    """Run A: a real process that wrote ``v0`` into the weight folder and is still running (its lease:
    a heartbeat every 0.1 s, stale after 1 s)."""
    root = tmp_path / "w"
    code = ("import sys, time; from srpo_graph.backends.weight_dir import WeightFolder; "
            "p = WeightFolder(sys.argv[1], 'run-A', interval=0.1, expiry=1.0).claim('v0'); p.mkdir(); "
            "(p / 'model.safetensors').write_text('A'); "
            "print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield root, proc
    proc.kill()
    proc.wait()


@pytest.mark.proc
def test_two_runs_on_one_weight_folder_refuse_each_other(run_a, tiny_dir, capsys):
    from transformers import AutoModelForCausalLM

    root, proc = run_a
    full = SGLangBackend("http://127.0.0.1:9", None, check_health=False, weight_dir=root, weight_owner="run-B")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    holder = f"in use by another run \\(run run-A, host {socket.gethostname()}, process {proc.pid}; last heartbeat"
    with pytest.raises(BackendError, match=holder):
        full.save_weights(model, 1)
    time.sleep(1.5)  # longer than A's expiry: its heartbeat keeps the lease fresh
    with pytest.raises(BackendError, match="in use by another run"):
        _lora(root, "run-B").sync_weights(_Saved(), 1)
    assert (root / "v0" / "model.safetensors").read_text() == "A"  # A's live version is intact
    assert sorted(p.name for p in root.iterdir()) == [LEASE, MANIFEST, "v0"]
    proc.kill()
    proc.wait()  # run A is over: once its heartbeat is stale, B takes over and adopts the folder
    deadline = time.monotonic() + 60
    while True:
        try:
            full.save_weights(model, 1)
            break
        except WeightFolderError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert f"taking over the lease of run run-A, host {socket.gethostname()}, process {proc.pid}" in \
        capsys.readouterr().err
    full.weights.keep_only({"v1"})
    assert sorted(p.name for p in root.iterdir()) == [LEASE, MANIFEST, "v1"]
    full.close()
    assert not (root / LEASE).exists()  # released on close


def test_a_second_owner_in_the_same_process_is_refused_until_the_first_closes(tmp_path):
    first = WeightFolder(tmp_path / "w", "run-A")
    first.claim("v0").mkdir()
    for second in (WeightFolder(tmp_path / "w", "run-B"), WeightFolder(tmp_path / "w", "run-A")):
        with pytest.raises(WeightFolderError, match=f"run run-A, host {socket.gethostname()}, process {os.getpid()}"):
            second.claim("v1")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [LEASE, MANIFEST, "v0"]
    first.close()
    assert not (tmp_path / "w" / LEASE).exists()
    second = WeightFolder(tmp_path / "w", "run-B")
    second.claim("v1").mkdir()  # free at once: no expiry to wait for
    second.close()


def _foreign_lease(root: Path, age: float) -> None:
    """A lease as a run on another host writes it, its heartbeat ``age`` seconds old."""
    root.mkdir(parents=True, exist_ok=True)
    (root / LEASE).write_text(json.dumps({"run": "/shared/runs/other", "owner": "run-other", "host": "node-7",
                                          "pid": os.getpid(), "token": "0123456789abcdef",
                                          "heartbeat": time.time() - age, "interval": 10.0, "expiry": 60.0}))


def test_a_fresh_lease_of_another_host_is_refused(tmp_path):
    """Before: a manifest of another host counted as dead, and its live versions were rewritten."""
    root = tmp_path / "w"
    _foreign_lease(root, 5.0)
    with pytest.raises(WeightFolderError) as info:
        WeightFolder(root, "run-B").claim("v0")
    said = str(info.value)
    assert "run /shared/runs/other, host node-7, process" in said and "last heartbeat 5." in said, said
    assert "stale after 60s" in said and not (root / "v0").exists()
    # the same owner id on another host (a run folder of the same path there) is not this run resumed
    with pytest.raises(WeightFolderError, match="host node-7"):
        WeightFolder(root, "run-other").claim("v0")
    (root / LEASE).unlink()
    _foreign_lease(root, -5.0)  # the holder's clock runs 5 s ahead: fresh all the same
    with pytest.raises(WeightFolderError, match="host node-7"):
        WeightFolder(root, "run-B").claim("v0")


def test_an_expired_lease_is_taken_over_with_one_line(tmp_path, capsys):
    root = tmp_path / "w"
    _foreign_lease(root, 61.0)
    mine = WeightFolder(root, "run-B")
    mine.claim("v0").mkdir()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "taking over the lease of run /shared/runs/other, host node-7" in err, err
    assert "last heartbeat 61s ago (expiry 60s)" in err
    assert json.loads((root / LEASE).read_text())["owner"] == "run-B"
    mine.close()
    assert not (root / LEASE).exists() and sorted(p.name for p in root.iterdir()) == [MANIFEST, "v0"]


def test_a_holder_whose_lease_was_taken_over_refuses_to_write(tmp_path):
    """A holder suspended past its expiry (its heartbeat stopped): another run took the folder, and the
    holder's next write is refused instead of writing over it."""
    root = tmp_path / "w"
    slow = WeightFolder(root, "run-A", interval=0.5, expiry=1.0)
    slow.claim("v0").mkdir()
    slow.lease._stop.set()  # the heartbeat stops, as in a process stopped (SIGSTOP) that long
    time.sleep(1.2)
    other = WeightFolder(root, "run-B")
    other.claim("v1").mkdir()
    with pytest.raises(WeightFolderError, match="lease on the weight folder was taken over \\(run run-B"):
        slow.claim("v2")
    assert not (root / "v2").exists()
    slow.close()
    assert (root / LEASE).exists()  # still run-B's: closing the old holder leaves it alone
    other.close()


def test_a_resumed_run_is_the_same_owner(tmp_path):
    run = tmp_path / "run"
    first = WeightFolder(tmp_path / "w", run_owner(run))
    first.claim("v0").mkdir()
    first.close()  # the run stopped
    again = WeightFolder(tmp_path / "w", run_owner(run))  # the resumed run: another object (or process)
    assert again.written() == ["v0"]
    again.claim("v1").mkdir()
    again.keep_only({"v1"})
    assert not (tmp_path / "w" / "v0").exists()
    assert json.loads((tmp_path / "w" / LEASE).read_text())["run"] == str(run.resolve())  # named by its folder
    again.close()


@pytest.mark.proc
def test_a_run_resumed_after_a_kill_takes_its_own_lease_at_once(tmp_path):
    """kill -9 leaves the run's lease fresh; the resumed run (same run folder: the run folder's lock
    admits one process per run) takes it over without waiting for the expiry."""
    run, root = tmp_path / "run", tmp_path / "w"
    code = ("import sys; from srpo_graph.backends.weight_dir import WeightFolder, run_owner; "
            "WeightFolder(sys.argv[1], run_owner(sys.argv[2])).claim('v0').mkdir()")
    subprocess.run([sys.executable, "-c", code, str(root), str(run)], cwd=ROOT, check=True,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # exits without close: lease left
    assert json.loads((root / LEASE).read_text())["heartbeat"] > time.time() - 60
    again = WeightFolder(root, run_owner(run))
    again.claim("v1").mkdir()
    assert again.written() == ["v0", "v1"]
    again.close()


@pytest.mark.proc
def test_a_weight_folder_conflict_stops_a_run_without_blaming_a_server(run_a, tmp_path):
    """A real second owner: the stop it causes says to fix the weight folder, not to "check the
    server's log" (there is nothing wrong with any server)."""
    from srpo_graph.backends.weight_dir import WeightFolderError
    from srpo_graph.train.stops import as_stop

    root, _ = run_a
    with pytest.raises(WeightFolderError) as info:
        WeightFolder(root, "run-B").claim("v1")
    run = tmp_path / "run"
    (run / "sglang").mkdir(parents=True)  # even where this run launched a server
    (run / "config.toml").write_text("")  # a run that has started
    advice = as_stop(info.value, run, 3, None).advice("x.wf")
    assert "in use by another run" in advice and "fix the weight folder as said above, then resume" in advice
    assert "check the server" not in advice and "log" not in advice.split("\n")[-1], advice


def test_the_end_of_a_run_releases_the_leases_it_took(tmp_path):
    """``server_scope`` (around every run) releases the leases taken inside it -- an in-process resume or
    the next run need not wait for their expiry -- and leaves one taken before it alone."""
    from srpo_graph.train.rollout.backends import server_scope

    before = WeightFolder(tmp_path / "before", "run-0")
    before.claim("v0")
    with server_scope():
        inside = WeightFolder(tmp_path / "w", "run-A")
        inside.claim("v0")
    assert not (tmp_path / "w" / LEASE).exists() and (tmp_path / "before" / LEASE).exists()
    after = WeightFolder(tmp_path / "w", "run-B")
    after.claim("v1")  # free at once
    after.close()
    before.close()


def test_takers_of_an_expired_lease_racing_get_one_owner(tmp_path, capsys):
    """Twelve owners take an expired lease at the same moment (threads), 20 times over: each time
    exactly one holds it and the others are refused naming it. (Before: a taker that had judged the
    old lease stale could rename away the lease another had just linked in; a quarter of such rounds
    ended with 2-4 owners, and the fast lane saw one under load.)"""
    import threading

    for round_ in range(20):
        root = tmp_path / f"w{round_}"
        _foreign_lease(root, 600.0)
        folders = [WeightFolder(root, f"run-{i}") for i in range(12)]
        won, refused = [], []
        start = threading.Barrier(len(folders))

        def take(f: WeightFolder) -> None:
            start.wait()
            try:
                f.claim("v0")
                won.append(f.owner)
            except WeightFolderError as e:
                refused.append(str(e))

        threads = [threading.Thread(target=take, args=(f,)) for f in folders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == 11, (round_, won, refused)
        assert all(f"in use by another run (run {won[0]}" in r for r in refused), refused
        assert json.loads((root / LEASE).read_text())["owner"] == won[0]
        for f in folders:
            f.close()
        assert sorted(p.name for p in root.iterdir()) == [MANIFEST]  # no lease, marker or moved file left
