"""Overlapped rollouts (issue 26 item 2) without a server: the weight gate between requests and
syncs (real threads, the real tiny transformers backend), ``max_staleness = 0`` through the
overlapped stage reproduces the synchronous loop exactly (traces and metrics), a failure in the
producer surfaces in the main thread as the synchronous stage's exception, and the refusals.
The overlap itself on the real CPU SGLang server: tests/backends/test_sglang_async.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from srpo_graph.backends.base import GenerationRequest
from srpo_graph.errors import BackendError, ConfigError
from srpo_graph.train import trainer as trainer_mod
from srpo_graph.train.config.loading import validate
from srpo_graph.train.config.refusals import check_async
from srpo_graph.train.observe.metrics import deterministic_fields, read_metrics
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.rollout.gate import GateClosed, GatedBackend, WeightGate
from srpo_graph.train.rollout.overlapped import AsyncRollouts
from srpo_graph.train.stops import RunStopped
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_seq.wf"


def _cfg(run: Path, **rollout) -> dict:
    return {"steps": 3, "seed": 5, "run_dir": str(run), "rollout": {"tasks_per_step": 2, "samples": 2, **rollout},
            "eval": {"every": 0}, "checkpoint": {"every": 2}, "compile": {"micro_batch_tokens": 64},
            "logging": {"tensorboard": False, "plots": False, "progress": False, "traces_every": 1}}


def test_a_sync_waits_for_the_call_in_flight_and_new_calls_wait_for_the_sync():
    gate = WeightGate(deadline=10)
    events: list[str] = []
    in_flight = threading.Event()
    release = threading.Event()

    def request(name: str, hold: threading.Event | None = None) -> None:
        with gate.shared():
            events.append(f"{name} sent")
            if hold is not None:
                in_flight.set()
                hold.wait(10)
            events.append(f"{name} back")

    def sync() -> None:
        with gate.exclusive():
            events.append("sync")

    first = threading.Thread(target=request, args=("r1", release))
    first.start()
    assert in_flight.wait(10)
    writer = threading.Thread(target=sync)
    writer.start()
    while not gate._writers_waiting:  # the sync is waiting for r1
        time.sleep(0.01)
    late = threading.Thread(target=request, args=("r2",))  # sent while the sync waits: after it (writer first)
    late.start()
    time.sleep(0.2)
    assert events == ["r1 sent"]
    release.set()
    for t in (first, writer, late):
        t.join(10)
    assert events == ["r1 sent", "r1 back", "sync", "r2 sent", "r2 back"]


def test_every_wait_on_the_gate_has_a_deadline_and_a_closed_gate_sends_nothing():
    gate = WeightGate(deadline=0.3)
    held = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with gate.shared():
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="a weight sync waited 0 s for 1 generate call"):
        with gate.exclusive():
            pass
    assert time.monotonic() - t0 < 5
    done.set()
    t.join(10)
    with gate.exclusive():  # the failed wait left no writer pending
        assert gate.readers == 0
    gate.close()
    with pytest.raises(GateClosed):
        with gate.shared():
            pass


def test_an_output_carries_the_version_its_request_was_sent_at():
    """The real tiny backend behind the gate: a sync started while a call is in flight lands after it,
    so that call's outputs keep the old version and the next call's have the new one."""
    import torch

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.tiny import ensure_tiny_model

    tiny_backend = TransformersBackend.from_pretrained(str(ensure_tiny_model()))

    gated = GatedBackend(tiny_backend, WeightGate(deadline=60))
    model = tiny_backend.model
    req = [GenerationRequest((5, 6, 7), 4, seed=1)]
    out: dict[str, object] = {}
    started = threading.Event()
    original = tiny_backend.generate

    def slow_generate(requests):  # a real delay: the call stays in flight while the sync is asked
        started.set()
        time.sleep(0.5)
        return original(requests)

    tiny_backend.generate = slow_generate
    try:
        t = threading.Thread(target=lambda: out.setdefault("first", gated.generate(req)))
        t.start()
        started.wait(10)
        with torch.no_grad():
            gated.sync_weights(model, 7)  # waits for the call in flight
        t.join(10)
    finally:
        del tiny_backend.generate
    assert out["first"][0].weight_version == 0  # type: ignore[index]
    assert gated.generate(req)[0].weight_version == 7


def _traces(run: Path) -> dict[str, list[dict]]:
    out = {}
    for path in sorted((run / "traces").glob("step_*.jsonl")):
        out[path.name] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


def test_max_staleness_0_through_the_overlapped_stage_is_the_synchronous_loop(tmp_path, monkeypatch):
    """The same run twice on the tiny transformers backend: the synchronous stage, then the overlapped
    stage with k = 0 (producer thread, gates): identical traces and deterministic metrics."""
    train(WF, validate(_cfg(tmp_path / "sync")))
    made: list[AsyncRollouts] = []

    def overlapped(*args, **kwargs):
        made.append(AsyncRollouts(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(trainer_mod, "make_rollouts", overlapped)
    train(WF, validate(_cfg(tmp_path / "async")))
    assert made and made[0].k == 0 and made[0].dropped == []
    traces = _traces(tmp_path / "sync")
    assert sorted(traces) == ["step_1.jsonl", "step_2.jsonl", "step_3.jsonl"] and all(traces.values())
    assert traces == _traces(tmp_path / "async")
    a, b = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("sync", "async"))
    assert [deterministic_fields(r) for r in a] == [deterministic_fields(r) for r in b]
    assert all(r["staleness/max"] == 0 for r in b) and all(r["async/ahead"] == 0 for r in b)


def test_a_failure_in_the_producer_stops_the_run_as_the_synchronous_stage_does(tmp_path, monkeypatch):
    from tests.support.user_code import make

    path, _, _ = make(tmp_path, reward="raising_reward")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "t{i}", "target": {i}}}\n' for i in range(6)), encoding="utf-8")
    monkeypatch.setattr(trainer_mod, "make_rollouts", AsyncRollouts)
    with pytest.raises(RunStopped, match="rollout stopped: 4 of 4 episodes failed"):
        train(path, validate(_cfg(tmp_path / "run", tasks=str(tasks))))


def test_overlap_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="need a server backend or a rollout worker; `transformers` samples from "
                                          "the model being"):
        check_async(validate({"rollout": {"max_staleness": 1}}))
    with pytest.raises(ConfigError, match="not supported under torchrun yet"):
        check_async(validate({"rollout": {"max_staleness": 2, "backend": "sglang"}}), DistInfo(rank=0, world_size=2))
    check_async(validate({"rollout": {"max_staleness": 1, "backend": "sglang"}}))  # one process, a server: fine
    with pytest.raises(ConfigError, match="partial rollouts pause and resume SGLang requests"):
        check_async(validate({"rollout": {"partial_rollouts": True, "backend": "sglang"}}))  # k = 0


def test_the_dispatch_rule_with_a_plugged_in_sampler():
    """The stage's own rule, through its ``sampler`` hook (where the rollout worker process of issue
    26 item 4 plugs in; a recording function stands in for it until that worker is merged): batch s is
    asked for only once the version is >= s - 1 - k, with the tasks and seed the synchronous stage
    gives step s, and the batches come back in step order whatever order they finish in."""
    from srpo_graph.train.rollout.tasks import task_indices

    k, steps = 2, 6
    cfg = validate(
        {"steps": steps, "seed": 3, "rollout": {"backend": "sglang", "max_staleness": k, "tasks_per_step": 2}}
    )
    tasks = [f"t{i}" for i in range(7)]
    calls: dict[int, tuple[int, list, int]] = {}
    lock = threading.Lock()

    def sampler(batch, seed):
        step = seed - 3 * 1_000_003
        with lock:
            calls[step] = (stage._version, batch, seed)
        time.sleep(0.3 if step % 2 else 0.05)  # odd steps finish after the next even one
        return [step], None

    pushed: list[int] = []
    stage = AsyncRollouts(None, tasks, [], cfg, DistInfo(), sampler=sampler, on_weights=pushed.append)

    stage.load_state_dict({"cursor": 4})  # a resumed run's cursor
    try:
        for s in range(1, steps + 1):
            got = stage.get(s)
            assert got.episodes == [s] and stage.state_dict()["cursor"] == 4 + s
            assert got.metrics["async/started_at_version"] >= s - 1 - k  # the rule, at dispatch time
            time.sleep(0.2)  # the update
            stage.weights_updated(s)
    finally:
        stage.close()
    assert sorted(calls) == list(range(1, steps + 1)) and stage.dropped == [] and pushed == list(range(1, steps + 1))
    for s, (version, batch, seed) in calls.items():
        assert version >= s - 1 - k
        assert batch == [tasks[i] for i in task_indices(len(tasks), 4 + s - 1, 2, 3)] and seed == 3 * 1_000_003 + s
    assert calls[3][0] == 0  # k = 2: batch 3 started before any update
