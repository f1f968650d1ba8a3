"""The rollout worker process (issue 26 item 4, transformers backend): ``train/rollout/worker/client.py``.

A real child process with its own copies of the tiny model, real gloo weight pushes, real
executor runs: its episodes equal the in-process backend's for the same weights and seed, for
every kind of policy (full, LoRA adapter, adapter base, frozen) at once; a LoRA push carries the
adapter only; errors, a dead worker and a dead trainer are handled; ``rollout.worker = true``
trains to the same metrics as in-process sampling, resume included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.errors import BackendError
from srpo_graph.lang import load_workflow
from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import load_tokenizer
from srpo_graph.runtime.executor import run as run_episodes
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import deterministic_fields, read_metrics
from srpo_graph.train.policies.lora import AdapterModel, SharedBase
from srpo_graph.train.rollout.worker.client import RolloutWorker
from srpo_graph.train.trainer import train
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EVERY_KIND = """workflow every_kind
import std
task { target: int }
policy base = "tiny"
policy role_a = lora("base", r=4, alpha=8, targets=[q_proj, v_proj])
policy full = "tiny"
policy judge = "tiny" frozen
agent a { policy: role_a prompt: "<a>{task.target}" sample { max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6",
"7", "8", "9"] }
  output: int via std.digit }
agent c { policy: base prompt: "<c>{task.target}" sample { max_tokens: 3 } output: text }
agent f { policy: full prompt: "<b>{task.target}" sample { max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6",
"7", "8", "9"] }
  output: int via std.digit }
agent j { policy: judge prompt: "<j>{task.target}" sample { max_tokens: 3 } output: text }
transition joint { consume: a, c, f, j activate: end }
start: a, c, f, j
reward: std.digits_sum_to(task.target, a, f)
"""


class TrainerSide:
    """The trainer's own models of EVERY_KIND, built as ``lora.build_slots`` / ``frozen.load_frozen`` do."""

    def __init__(self, wf):
        from transformers import AutoModelForCausalLM

        path = resolve_model("tiny")
        self.tok = load_tokenizer(path)
        self.shared = SharedBase(path, [wf.policy_by_name["role_a"]], dtype=torch.float32, device="cpu")
        self.full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.judge = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.judge.requires_grad_(False)
        self.models = {
            "role_a": AdapterModel(self.shared, "role_a"),
            "base": AdapterModel(self.shared, None),
            "full": self.full,
        }

    def perturb(self, seed: int) -> None:
        """What an update does: the adapter and the full model move, the base and the judge do not."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in [*self.shared.adapter_parameters("role_a"), *self.full.parameters()]:
                p.add_(0.05 * torch.randn(p.shape, generator=g))

    def run(self, wf, tasks, versions):
        backends = {n: TransformersBackend(m, self.tok) for n, m in {**self.models, "judge": self.judge}.items()}
        return run_episodes(wf, tasks, backends, samples=3, seed=11, policy_versions={**versions, "judge": 0})


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory):
    path = tmp_path_factory.mktemp("wf") / "every_kind.wf"
    path.write_text(EVERY_KIND)
    wf = load_workflow(path)
    worker = RolloutWorker(wf, timeout=300)
    yield wf, load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", wf)[:3], worker
    worker.close()


@pytest.mark.proc
def test_worker_episodes_equal_the_in_process_backend_for_every_kind_of_policy(every_kind):
    wf, tasks, worker = every_kind
    side = TrainerSide(wf)
    previous = None
    for version in (1, 2):  # each push replaces the worker's weights: the episodes follow
        side.perturb(version)
        worker.push_weights(side.models, version)
        versions = {n: version for n in side.models}
        got = worker.run(wf, tasks, samples=3, seed=11, policy_versions=versions)
        want = side.run(wf, tasks, versions)
        assert [e.to_json() for e in got.episodes] == [e.to_json() for e in want.episodes]
        assert got.stats.episodes == 9 and got.stats.tokens_generated == want.stats.tokens_generated
        assert {o.policy_version for e in got.episodes for o in e.outputs if o.policy != "judge"} == {version}
        logprobs = [o.logprobs for e in got.episodes for o in e.outputs if o.policy == "full"]
        assert logprobs != previous
        previous = logprobs


@pytest.mark.proc
def test_run_from_a_thread_while_the_main_thread_pushes(every_kind):
    """The overlapped stage's pattern: a producer thread samples while the trainer pushes new weights.
    Requests are served one at a time, so a batch samples each policy at one version throughout, the
    one it records; the policies of one push move together."""
    import threading

    wf, tasks, worker = every_kind
    side = TrainerSide(wf)
    worker.push_weights(side.models, 20)
    results: list = []
    producer = threading.Thread(
        target=lambda: results.extend(worker.run(wf, tasks, samples=3, seed=11) for _ in range(3))
    )
    producer.start()
    for version in (21, 22):
        side.perturb(version)
        worker.push_weights(side.models, version)
    producer.join(timeout=120)
    assert not producer.is_alive() and len(results) == 3
    for res in results:
        versions = {o.policy_version for e in res.episodes for o in e.outputs if o.policy != "judge"}
        assert len(versions) == 1 and versions <= {20, 21, 22}
    # pushed one policy at a time (as PolicySlot.sync does), a batch may see the policies at two versions,
    # each output recording its own policy's
    worker.push_weights({"full": side.full}, 23)
    res = worker.run(wf, tasks, samples=3, seed=11)
    assert {(o.policy, o.policy_version) for e in res.episodes for o in e.outputs} == {
        ("full", 23),
        ("role_a", 22),
        ("base", 22),
        ("judge", 0),
    }
    assert worker.run(wf, tasks, samples=3, seed=11, policy_versions={"full": 23}).stats.episodes == 9


@pytest.mark.proc
def test_a_lora_push_carries_the_adapter_only(every_kind):
    wf, _, worker = every_kind
    side = TrainerSide(wf)
    before = dict(worker.stats)
    worker.push_weights({"role_a": side.models["role_a"], "base": side.models["base"]}, 7)
    adapter = sum(p.numel() * p.element_size() for p in side.shared.adapter_parameters("role_a"))
    base = sum(p.numel() * p.element_size() for p in side.full.parameters())
    assert worker.stats["bytes"] - before["bytes"] == adapter < base / 10
    assert worker.stats["tensors"] - before["tensors"] == len(side.shared.adapter_parameters("role_a"))
    with pytest.raises(BackendError, match=r"rollout worker \(pid \d+\).*'role_a' holds version 7, asked for 6"):
        worker.run(
            wf,
            load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", wf)[:1],
            samples=1,
            seed=0,
            policy_versions={"role_a": 6},
        )  # noqa: E501


@pytest.mark.proc
def test_worker_errors_are_backend_errors_naming_it_and_it_serves_on(every_kind):
    wf, tasks, worker = every_kind
    side = TrainerSide(wf)
    with pytest.raises(BackendError, match=r"rollout worker \(pid \d+\): weights of policy 'judge'.*not trained here"):
        worker.push_weights({"judge": side.judge}, 3)  # a frozen policy has no weights to take
    bad = side.full.model.embed_tokens.weight
    with pytest.raises(BackendError, match="do not fit its model"):
        worker.push_weights({"full": [("model.embed_tokens.weight", bad[:5])]}, 3)  # a wrong shape
    assert worker.run(wf, tasks[:1], samples=1, seed=0).stats.episodes == 1  # still serving


@pytest.mark.proc
@pytest.mark.parametrize("fault", ["killed", "stalled"])
def test_a_dead_or_stalled_worker_is_named_within_its_deadline(fault):
    """A real fault on demand: SIGKILL (dies) or SIGSTOP (stalls: answers nothing, ever)."""
    wf = load_workflow(ROOT / "workflows" / "coord_par2.wf")
    worker = RolloutWorker(wf, timeout=300)
    worker.timeout = 3.0  # the deadline of the waits to come (rollout.worker_timeout)
    os.kill(worker.proc.pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "coord.jsonl", wf)[:1]
    t0 = time.monotonic()
    why = r"exited with code -9" if fault == "killed" else r"did not answer within the deadline"
    with pytest.raises(BackendError, match=rf"rollout worker \(pid \d+\).*{why}"):
        worker.run(wf, tasks, samples=1, seed=0)
    assert time.monotonic() - t0 < 10
    assert worker.proc.poll() is not None  # a stalled worker is stopped, not left behind
    with pytest.raises(BackendError, match="stopped earlier"):
        worker.run(wf, tasks, samples=1, seed=0)
    worker.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by a dead parent's init yet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.proc
def test_the_worker_exits_when_its_trainer_is_killed(tmp_path):
    script = (
        "import sys, time\n"
        "from srpo_graph.lang import load_workflow\n"
        "from srpo_graph.train.rollout.worker.client import RolloutWorker\n"
        f"w = RolloutWorker(load_workflow({str(ROOT / 'workflows' / 'coord_par2.wf')!r}), timeout=300)\n"
        "print(w.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert _alive(pid)
        parent.kill()  # SIGKILL: no finalizer, no atexit runs in the trainer
        parent.wait()
        # it notices the death and exits (a loaded machine delays both): a generous bound on a hang
        wait_for(lambda: not _alive(pid), stall=180, what="the rollout worker's exit after its trainer's death")
    finally:
        parent.kill()


def _config(run: Path, **over):
    data = {
        "run_dir": str(run),
        "steps": 2,
        "seed": 3,
        "rollout": {"tasks_per_step": 3, "samples": 4},
        "checkpoint": {"every": 1, "keep_last": 3},
        "eval": {"every": 2, "num_tasks": 4, "mode": "sampled", "samples": 2},
        "logging": {"tensorboard": False, "plots": False, "progress": False},
    }
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return validate(data)


def _rows(run: Path) -> list[dict]:
    return [deterministic_fields(r) for r in read_metrics(run / "metrics.jsonl")]


@pytest.mark.proc
@pytest.mark.parametrize("workflow", ["every_kind", pytest.param("coord_lora2", marks=pytest.mark.slow)])
def test_training_with_the_worker_gives_the_same_metrics_and_resumes(tmp_path, workflow):
    """Several policies of every kind (every_kind: a full policy, a LoRA adapter on a base that samples
    too, a frozen policy) and an example LoRA workflow (coord_lora2): every deterministic metric of
    every step equal with sampling in the worker (every_kind: stopped and resumed on the way)."""
    if workflow == "every_kind":
        wf = tmp_path / "every_kind.wf"
        wf.write_text(EVERY_KIND)
    else:
        wf = ROOT / "workflows" / f"{workflow}.wf"
    tasks = {"tasks": str(ROOT / "workflows" / "tasks" / "coord.jsonl")}
    inproc = train(wf, _config(tmp_path / "inproc", rollout=tasks))
    if workflow == "every_kind":  # stopped after step 1, resumed: a new worker from the checkpoint's weights
        train(wf, _config(tmp_path / "worker", rollout={**tasks, "worker": True}, debug={"stop_after_step": 1}))
        resumed = train(wf, _config(tmp_path / "worker", rollout={**tasks, "worker": True}), resume=True)
        assert resumed.steps_this_run == 1
    else:
        resumed = train(wf, _config(tmp_path / "worker", rollout={**tasks, "worker": True}))
    assert inproc.steps == resumed.steps == 2
    want, got = _rows(tmp_path / "inproc"), _rows(tmp_path / "worker")
    assert [r["step"] for r in got] == [1, 2]
    assert any(r["reward"] > 0 for r in want) and all(r["updates"] > 0 for r in want)  # something to learn from
    assert "eval/reward" in got[1]  # the eval rollout (greedy or sampled) runs in the worker too
    assert got == want


def test_worker_is_refused_on_a_server_backend():
    from srpo_graph.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout.worker"):
        validate({"rollout": {"worker": True, "backend": "sglang"}})


@pytest.mark.proc
def test_overlapped_rollouts_sample_in_the_worker_within_the_bound(tmp_path):
    """``rollout.max_staleness=1`` on the transformers backend through the rollout worker: batch s+1 is
    sampled in the worker while update s runs in the trainer, every output of step s was sampled at
    version s-1 or s-2 (recorded per output), some at s-2 (the overlap really happened), and
    the run trains to the end. Without the worker the same command is refused, naming the fix."""
    from srpo_graph.errors import ConfigError
    from srpo_graph.runtime.trace import read_traces

    wf = ROOT / "workflows" / "coord_par2.wf"
    data = {
        "run_dir": str(tmp_path / "k1"),
        "steps": 4,
        "seed": 5,
        "rollout": {
            "tasks_per_step": 3,
            "samples": 4,
            "worker": True,
            "max_staleness": 1,
            "tasks": str(ROOT / "workflows" / "tasks" / "coord.jsonl"),
        },
        "checkpoint": {"every": 4},
        "eval": {"every": 0},
        "logging": {"tensorboard": False, "plots": False, "progress": False, "traces_every": 1},
    }
    summary = train(wf, validate(data))
    assert summary.steps == 4
    seen = set()
    for step in range(1, 5):
        versions = {
            o.policy_version for e in read_traces(tmp_path / "k1" / "traces" / f"step_{step}.jsonl") for o in e.outputs
        }
        assert versions and versions <= {max(0, step - 2), step - 1}, (step, versions)
        seen |= {step - 1 - v for v in versions}
    assert 1 in seen  # some batch was sampled a version behind: rollouts overlapped updates
    rows = read_metrics(tmp_path / "k1" / "metrics.jsonl")
    assert all("staleness/max" in r for r in rows) and max(r["staleness/max"] for r in rows) == 1
    with pytest.raises(ConfigError, match="rollout.worker=true"):
        train(
            wf,
            validate({**data, "run_dir": str(tmp_path / "refused"), "rollout": {**data["rollout"], "worker": False}}),
        )


def test_each_stop_by_a_backend_advises_what_failed():
    """The rule over the backend errors that stop a run: the worker's and the weight folder's say what
    to check (there is no server); a server's names its log only where this run launched one."""
    import tempfile

    from srpo_graph.backends.weight_dir import WeightFolderError
    from srpo_graph.train.rollout.worker.client import WorkerRefused
    from srpo_graph.train.rollout.worker.wire import WorkerError
    from srpo_graph.train.stops import as_stop

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "config.toml").write_text("")  # a run that has started
        for exc in (WorkerError("w"), WorkerRefused("w"), WeightFolderError("w")):
            last = as_stop(exc, run, 1, None).advice("x.wf").splitlines()[-1]
            assert last.startswith(f"  {exc.remedy}, then resume") and "server" not in last, last
        assert "check the server named above" in as_stop(BackendError("s"), run, 1, None).advice("x.wf")
        (run / "sglang").mkdir()
        assert f"log of a server this run launched is in {run / 'sglang'}" in as_stop(
            BackendError("s"), run, 1, None).advice("x.wf")


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_pointing_at_the_worker(tmp_path):
    """kill -9 of the rollout worker of a real `srpo-graph train` after step 1: the run stops with the
    resume command and says to check the worker -- not a server's log (there is no server)."""
    run = tmp_path / "run"
    marker = f"SRPO_TEST_WORKER={tmp_path}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SRPO_TEST_WORKER": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", "train", str(ROOT / "workflows" / "coord_par2.wf"),
                             "--steps", "30", "--run-dir", str(run), "rollout.worker=true", "rollout.tasks_per_step=4",
                             "rollout.samples=4", "checkpoint.every=1", "eval.every=0", "logging.tensorboard=false",
                             "logging.plots=false", "logging.progress=false"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    worker = None
    while worker is None or not ((run / "metrics.jsonl").exists() and read_metrics(run / "metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        for p in Path("/proc").iterdir():
            try:
                if (p.name.isdigit() and b"rollout.worker.main" in (p / "cmdline").read_bytes()
                        and marker.encode() in (p / "environ").read_bytes()):
                    worker = int(p.name)
            except OSError:
                continue
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert "rollout worker" in err and "check the rollout worker's output above" in err, err[-3000:]
    assert "check the server" not in err and f"--resume {run}" in err, err[-3000:]
