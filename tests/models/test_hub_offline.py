"""Hub names on an offline machine (issue 37.3; srpo_graph/hfcache.py, ``models.resolve_model``).

A Hugging Face cache laid out exactly as ``huggingface_hub`` lays it out
(``models--Qwen--Qwen2.5-0.5B-Instruct/{blobs/<sha256>, snapshots/<revision>/<file> -> ../../blobs/...,
refs/main}``) holds a model on Qwen2.5's exact tokenizer (``qwen2.5-realvocab-test``, built here)
under the name ``Qwen/Qwen2.5-0.5B-Instruct``. With ``HF_HUB_OFFLINE=1`` and every connection off
this machine refused, ``check``, the language server's analysis and token rule, ``run``, ``train`` and
``eval`` of a chat workflow naming that hub name each succeed (one command each), and none of them
tried to connect anywhere; a hub name that is not in the cache is one error naming the cache and
the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPO = "Qwen/Qwen2.5-0.5B-Instruct"
REVISION = "7ae557604adf67be50417f59c2c2f167def9a775"  # any 40-hex commit: refs/main names it


def lay_out_hub_cache(hub: Path, repo: str, model_dir: Path, revision: str = REVISION) -> Path:
    """``model_dir``'s files in ``hub`` as huggingface_hub stores a download of ``repo``: content-addressed
    blobs, a snapshot folder of relative symlinks, ``refs/main`` naming the revision. The build's own
    marker files are left out (a downloaded model has none). Returns the snapshot folder."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / revision
    (folder / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)  # no newline, as huggingface_hub writes it
    for f in sorted(model_dir.iterdir()):
        if not f.is_file() or f.name.startswith("srpo_graph_"):
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy2(f, folder / "blobs" / digest)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    return snap


class NoNetwork:
    """Every connection to an address off this machine fails with ENETUNREACH and is recorded.

    A test double for a fault a real component cannot produce on demand here (this machine has a
    network): ``socket.socket.connect`` and ``socket.create_connection`` refuse any non-loopback
    address, so a library that dials out fails loudly and the attempt is kept for the assertion.
    Loopback and Unix sockets (torch's gloo store, a local server) still work."""

    def __init__(self, monkeypatch):
        self.attempts: list[object] = []
        real_connect, real_create = socket.socket.connect, socket.create_connection

        def local(address) -> bool:
            if not isinstance(address, tuple):
                return True  # AF_UNIX
            host = str(address[0])
            return host in ("localhost", "::1") or host.startswith("127.")

        def connect(sock, address):
            if not local(address):
                self.attempts.append(address)
                raise OSError(101, "Network is unreachable (test: no network)")
            return real_connect(sock, address)

        def create_connection(address, *a, **kw):
            if not local(address):
                self.attempts.append(address)
                raise OSError(101, "Network is unreachable (test: no network)")
            return real_create(address, *a, **kw)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket, "create_connection", create_connection)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, realvocab):
    """A workflow folder whose chat workflow names ``Qwen/Qwen2.5-0.5B-Instruct``, a hub cache holding
    it, the hub offline and the network unreachable."""
    model = realvocab("qwen2.5-realvocab-test")
    hub = tmp_path / "hf" / "hub"
    lay_out_hub_cache(hub, REPO, model)
    work = tmp_path / "work"
    (work / "tasks").mkdir(parents=True)
    wf = (ROOT / "workflows/chat_search_qwen3.wf").read_text(encoding="utf-8")
    assert 'policy m = "qwen3-test"' in wf
    (work / "chat_hub.wf").write_text(
        wf.replace("workflow chat_search_qwen3", "workflow chat_hub").replace('"qwen3-test"', f'"{REPO}"'),
        encoding="utf-8",
    )
    shutil.copy2(ROOT / "workflows/chat_tools.py", work / "chat_tools.py")
    tasks = (ROOT / "workflows/tasks/chat_search_qwen3.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    (work / "tasks" / "chat_hub.jsonl").write_text("\n".join(tasks) + "\n", encoding="utf-8")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))  # nothing built here is used
    monkeypatch.chdir(work)
    return work, hub, NoNetwork(monkeypatch)


@pytest.mark.slow
def test_check_run_train_eval_resolve_a_hub_name_from_the_offline_cache(offline_hub):
    from click.testing import CliRunner

    from srpo_graph.cli import app
    from srpo_graph.models import resolve_model

    work, hub, net = offline_hub
    snapshot = hub / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / REVISION
    assert resolve_model(REPO) == str(snapshot)
    cli = CliRunner()
    res = cli.invoke(app, ["check", "chat_hub.wf"])
    assert res.exit_code == 0, res.output
    # the language server's view of the same file: its analysis and its token rule (as `check`'s)
    from srpo_graph.lsp.document import analyze
    from srpo_graph.lsp.workers import token_diagnostics
    from srpo_graph.runtime.tokens import local_tokenizers

    doc = analyze(Path("chat_hub.wf").read_text(), str(work / "chat_hub.wf"))
    assert doc.workflow is not None and not [d for d in doc.diagnostics if d.severity == "error"], doc.diagnostics
    assert token_diagnostics(doc) == [] and len(local_tokenizers(doc.workflow)["m"]) == 151_665
    res = cli.invoke(app, ["run", "chat_hub.wf", "--tasks", "tasks/chat_hub.jsonl", "--samples", "2", "--limit", "2",
                           "--out", "traces.jsonl", "--quiet"])
    assert res.exit_code == 0, res.output
    episodes = [json.loads(line) for line in Path("traces.jsonl").read_text().splitlines()]
    first = episodes[0]["outputs"][0]
    assert len(episodes) == 4 and first["prompt_ids"][0] == 151644  # <|im_start|>: Qwen2.5's exact ids
    res = cli.invoke(app, ["train", "chat_hub.wf", "--steps", "1", "--run-dir", "run", "rollout.tasks_per_step=2",
                           "rollout.samples=2", "eval.every=0", "logging.tensorboard=false"])
    assert res.exit_code == 0, res.output
    assert json.loads(Path("run/metrics.jsonl").read_text().splitlines()[0])["tokens"] > 0
    res = cli.invoke(app, ["eval", "chat_hub.wf", "run", "--samples", "1", "--num-tasks", "2",
                           "--tasks", "tasks/chat_hub.jsonl"])
    assert res.exit_code == 0, res.output
    assert net.attempts == [], net.attempts  # not one connection off this machine
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_hub_name_missing_from_the_offline_cache_is_one_clear_error(offline_hub):
    from click.testing import CliRunner

    from srpo_graph.cli import app

    work, hub, net = offline_hub
    Path("chat_hub.wf").write_text(Path("chat_hub.wf").read_text().replace(REPO, "Qwen/Qwen3-0.6B"))
    res = CliRunner().invoke(app, ["run", "chat_hub.wf", "--tasks", "tasks/chat_hub.jsonl", "--samples", "1",
                                   "--out", "t.jsonl", "--quiet"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    text = " ".join(res.output.split())
    assert f"model 'Qwen/Qwen3-0.6B' is not in the Hugging Face cache at {hub}" in text
    assert "HF_HUB_OFFLINE=1" in text and "hf download Qwen/Qwen3-0.6B" in text
    assert net.attempts == []
