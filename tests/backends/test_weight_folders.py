"""One ownership rule for every path that writes or deletes in ``rollout.sglang.weight_dir``
(issue 23, item 2; ``backends/weight_dir.py``): the full-model sync and the LoRA adapter sync.

* the LoRA sync never deletes or replaces a user's ``v0..v2`` (before: it deleted them);
* two runs on one weight folder: while run A's process is alive (a real second process that wrote
  its ``v0`` through the same code), run B -- full-model or LoRA -- is refused at its first write,
  naming the folder and A; A's versions are intact (before: each deleted the other's live
  versions); once A's process is gone, B adopts the folder;
* a resumed run (same run folder, another process) is the same owner.
The HTTP side is not involved (the fake server of the client tests answers the LoRA calls); the
files, the manifest and the processes are real.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.backends.sglang import SGLangBackend
from srpo_graph.backends.sglang_lora import SGLangAdapterBackend
from srpo_graph.backends.weight_dir import MANIFEST, WeightFolder, run_owner
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
    assert sorted(p.name for p in root.iterdir()) == [MANIFEST, "v0", "v1", "v2", "v4"]
    assert all((root / n / "mine.txt").read_text() == n for n in ("v0", "v1", "v2"))


@pytest.fixture
def run_a(tmp_path):
    """Run A: a real process that wrote ``v0`` into the weight folder and is still running."""
    root = tmp_path / "w"
    code = ("import sys, time; from srpo_graph.backends.weight_dir import WeightFolder; "
            "p = WeightFolder(sys.argv[1], 'run-A').claim('v0'); p.mkdir(); (p / 'model.safetensors').write_text('A'); "
            "print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield root, proc
    proc.kill()
    proc.wait()


@pytest.mark.proc
def test_two_runs_on_one_weight_folder_refuse_each_other(run_a, tiny_dir):
    from transformers import AutoModelForCausalLM

    root, proc = run_a
    full = SGLangBackend("http://127.0.0.1:9", None, check_health=False, weight_dir=root, weight_owner="run-B")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    with pytest.raises(BackendError, match=f"in use by another run \\(owner run-A, process {proc.pid}"):
        full.save_weights(model, 1)
    with pytest.raises(BackendError, match="in use by another run"):
        _lora(root, "run-B").sync_weights(_Saved(), 1)
    assert (root / "v0" / "model.safetensors").read_text() == "A"  # A's live version is intact
    assert sorted(p.name for p in root.iterdir()) == [MANIFEST, "v0"]
    proc.kill()
    proc.wait()  # run A is over: B adopts the folder (what A wrote is srpo-graph's, stale)
    full.save_weights(model, 1)
    full.weights.keep_only({"v1"})
    assert sorted(p.name for p in root.iterdir()) == [MANIFEST, "v1"]


def test_a_resumed_run_is_the_same_owner(tmp_path):
    run = tmp_path / "run"
    first = WeightFolder(tmp_path / "w", run_owner(run))
    first.claim("v0").mkdir()
    again = WeightFolder(tmp_path / "w", run_owner(run))  # the resumed run: another object (or process)
    assert again.written() == ["v0"]
    again.claim("v1").mkdir()
    again.keep_only({"v1"})
    assert not (tmp_path / "w" / "v0").exists()


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
