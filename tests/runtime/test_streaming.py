"""The streaming scheduler (issue 26, item 1) on the real tiny model.

* Same seeds, same traces: the transformers backend driven through the streaming path (one
  ``generate`` call per episode wave, from worker threads) gives the traces of the lockstep
  scheduler, on sequential, parallel, mixed, routed, tool and two-policy workflows.
* Episodes do not wait for each other: with one slow request, another episode runs its whole
  multi-turn episode before that answer returns (streaming), not after it (lockstep).
* Backend failures: ``fail`` fails the episode of the failed request only; ``raise`` stops the run.
* Failure kinds and user-code deadlines as under lockstep: a tool that raises (kind ``tool``), a
  tool that hangs (a real ``time.sleep``; kind ``timeout`` at ``deadlines.tool``, naming the tool,
  while the other episodes finish), the same ``failed_by_kind`` / ``first_failure``.
* ``auto`` picks streaming for server backends (SGLang, an external endpoint) and lockstep for
  in-process ones.

``_Latency`` and ``_Failing`` wrap the real backend to add what a local model cannot produce on
demand: a slow answer, a failed request. Each serializes the real ``generate`` with a lock (the
in-process model is one object) and adds its delay or error outside it.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from srpo_graph.errors import BackendError
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.streaming import backend_concurrency, prefers_streaming
from srpo_graph.runtime.trace import Episode
from srpo_graph.runtime.usercode import Deadlines
from tests.support import workflows as wfs

ROOT = Path(__file__).resolve().parents[2]


class _Wrapped:
    scheduler = "streaming"

    def __init__(self, inner, concurrency: int = 8):
        self.inner, self.concurrency = inner, concurrency
        self.tokenizer, self.weight_version = inner.tokenizer, inner.weight_version
        self._lock = threading.Lock()
        self.log: list[tuple[float, str, str]] = []  # (time, "sent" | "back", request id)

    def _real(self, requests):
        with self._lock:
            return self.inner.generate(requests)

    def generate(self, requests):
        for r in requests:
            self.log.append((time.monotonic(), "sent", r.request_id))
        out = self._generate(requests)
        for r in requests:
            self.log.append((time.monotonic(), "back", r.request_id))
        return out

    def _generate(self, requests):
        return self._real(requests)

    def sync_weights(self, model, version):  # pragma: no cover - not used here
        self.inner.sync_weights(model, version)

    def close(self):
        pass


class _Latency(_Wrapped):
    """Requests whose id starts with ``slow`` take ``delay`` seconds more."""

    def __init__(self, inner, slow: str, delay: float):
        super().__init__(inner)
        self.slow, self.delay = slow, delay

    def _generate(self, requests):
        if any(r.request_id.startswith(self.slow) for r in requests):
            time.sleep(self.delay)
        return self._real(requests)


class _Failing(_Wrapped):
    """Requests whose id starts with ``bad`` fail (a server error)."""

    def __init__(self, inner, bad: str):
        super().__init__(inner)
        self.bad = bad

    def _generate(self, requests):
        if any(r.request_id.startswith(self.bad) for r in requests):
            raise BackendError(f"server error on purpose for {self.bad}")
        return self._real(requests)


def _key(ep: Episode):
    d = ep.model_dump()
    lps = [lp for o in d["outputs"] for lp in o.pop("logprobs")]
    return d, lps


def _same(a, b):
    assert len(a.episodes) == len(b.episodes)
    for x, y in zip(a.episodes, b.episodes):
        (dx, lx), (dy, ly) = _key(x), _key(y)
        assert dx == dy
        assert max((abs(p - q) for p, q in zip(lx, ly)), default=0) < 1e-5  # batched vs single forward


def _two_policies(tmp_path):
    from srpo_graph.lang import load_workflow

    text = (ROOT / "workflows" / "coord_mixed.wf").read_text()
    text = text.replace('policy tiny = "tiny"', 'policy tiny = "tiny"\npolicy other = "tiny"')
    head, tail = text.split("agent b {", 1)
    text = head + "agent b {" + tail.replace("policy: tiny", "policy: other", 1)
    path = tmp_path / "two.wf"
    path.write_text(text)
    return load_workflow(path)


WORKFLOWS = {
    "seq": wfs.coord_seq, "mixed": wfs.coord_mixed, "routed": wfs.coord_routed,
    "tool": lambda: wfs.with_tool("failing_tools", "note"),
    "tool_fails": lambda: wfs.with_tool("failing_tools", "explode_on_3"),
    "par5": lambda: __import__("srpo_graph.lang", fromlist=["load_workflow"]).load_workflow(
        ROOT / "workflows" / "coord_par5.wf"),
}


@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_streaming_gives_the_lockstep_traces(tiny_backend, coord_tasks, name):
    wf = WORKFLOWS[name]()
    backends = {p.name: tiny_backend for p in wf.policies}
    lock = run(wf, coord_tasks, backends, samples=3, seed=11, scheduler="lockstep")
    wrapped = _Wrapped(tiny_backend)
    streamed = run(wf, coord_tasks, {p.name: wrapped for p in wf.policies}, samples=3, seed=11)  # auto: streaming
    assert streamed.stats.generate_calls > lock.stats.generate_calls  # one call per episode wave
    _same(lock, streamed)
    assert streamed.stats.tokens_generated == lock.stats.tokens_generated
    assert streamed.stats.failures == lock.stats.failures
    assert streamed.stats.failed_by_kind == lock.stats.failed_by_kind
    assert streamed.stats.first_failure == lock.stats.first_failure
    if name == "tool_fails":
        assert lock.stats.failed_by_kind == {"tool": 3}  # task t3's three episodes
    # the in-process backend itself, forced through the streaming path (concurrency 1)
    _same(lock, run(wf, coord_tasks, backends, samples=3, seed=11, scheduler="streaming"))
    # with few episodes alive at once, too
    _same(lock, run(wf, coord_tasks, {p.name: wrapped for p in wf.policies}, samples=3, seed=11, max_concurrent=4))


def test_two_policies_on_two_backends(tiny_backend, coord_tasks, tmp_path):
    from srpo_graph.backends.transformers import TransformersBackend

    wf = _two_policies(tmp_path)
    other = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer)  # a second backend object
    lock = run(wf, coord_tasks, {"tiny": tiny_backend, "other": other}, samples=2, seed=4, scheduler="lockstep")
    streamed = run(wf, coord_tasks, {"tiny": _Wrapped(tiny_backend), "other": _Wrapped(other)}, samples=2, seed=4)
    _same(lock, streamed)
    assert {o.policy for e in streamed.episodes for o in e.outputs} == {"tiny", "other"}


def _first_back(log, prefix):
    return min(t for t, kind, rid in log if kind == "back" and rid.startswith(prefix))


def _first_sent(log, prefix):
    return min(t for t, kind, rid in log if kind == "sent" and rid.startswith(prefix))


def test_an_episode_does_not_wait_for_another_ones_slow_answer(tiny_backend, coord_tasks):
    wf = wfs.coord_seq()  # a then b: two turns per episode
    tasks = coord_tasks[:2]
    slow = "t0@1/0/o0"  # episode t0's first output
    streaming = _Latency(tiny_backend, slow, 0.8)
    run(wf, tasks, {"tiny": streaming}, samples=1, seed=1)
    # t1 sent its second turn and got it back before t0's first answer returned
    assert _first_back(streaming.log, "t1@1/0/o1") < _first_back(streaming.log, slow)
    lockstep = _Latency(tiny_backend, slow, 0.8)
    run(wf, tasks, {"tiny": lockstep}, samples=1, seed=1, scheduler="lockstep")
    assert _first_sent(lockstep.log, "t1@1/0/o1") > _first_back(lockstep.log, slow)  # the round waited


def test_backend_failures_under_streaming(tiny_backend, coord_tasks):
    wf = wfs.coord_seq()
    failing = _Failing(tiny_backend, "t2@5/1/o1")
    res = run(wf, coord_tasks, {"tiny": failing}, samples=2, seed=5, on_backend_error="fail")
    bad = [e for e in res.episodes if e.status == "failed"]
    assert [(e.task_id, e.sample) for e in bad] == [("t2", 1)] and "server error on purpose" in bad[0].error
    assert res.stats.backend_failures == 1 and "on purpose" in (res.stats.backend_error or "")
    assert all(e.status == "ok" for e in res.episodes if e not in bad)
    with pytest.raises(BackendError, match="on purpose"):
        run(wf, coord_tasks, {"tiny": _Failing(tiny_backend, "t2@5/1/o1")}, samples=2, seed=5)


HANGING_TOOL = '''
import time

def hang_on_3(a: int, target: int) -> str:
    if target == 3:
        time.sleep(3600)  # a real hang: only the deadline ends its episode
    return f"ok{target}"
'''


@pytest.mark.parametrize("scheduler", ["auto", "streaming"])
def test_a_hanging_tool_fails_its_episode_at_the_deadline_under_streaming(tiny_backend, coord_tasks, tmp_path,
                                                                          monkeypatch, scheduler):
    mod = f"hanging_tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(HANGING_TOOL, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = wfs.with_tool(mod, "hang_on_3")
    backend = _Wrapped(tiny_backend) if scheduler == "auto" else tiny_backend  # auto: a server, so streaming
    t0 = time.monotonic()
    streamed = run(wf, coord_tasks, {"tiny": backend}, samples=2, seed=2, deadlines=Deadlines(tool=0.3),
                   scheduler=scheduler)
    assert time.monotonic() - t0 < 20  # the hanging threads are abandoned at 0.3 s, never waited for
    assert streamed.stats.generate_calls > 2 * len(coord_tasks)  # it did stream: one call per episode wave
    for ep in streamed.episodes:
        if ep.task_id == "t3":
            assert ep.status == "failed", ep
            assert "tool 'note' (tools.hang_on_3) did not return within 0.3 s (rollout.deadlines.tool) " \
                   "(transition 'look')" in ep.error, ep.error
        else:
            assert ep.status == "ok", ep.error  # the others finished meanwhile
    assert streamed.stats.failed_by_kind == {"timeout": 2} and streamed.stats.failures == 2
    lock = run(wf, coord_tasks, {"tiny": tiny_backend}, samples=2, seed=2, deadlines=Deadlines(tool=0.3),
               scheduler="lockstep")
    _same(lock, streamed)  # same outputs, same errors (the tool's .wf position), same rewards
    assert lock.stats.first_failure == streamed.stats.first_failure


def test_auto_picks_streaming_for_servers_only(tiny_backend):
    from srpo_graph.backends.sglang import SGLangBackend

    server = SGLangBackend("http://127.0.0.1:9", tiny_backend.tokenizer, concurrency=48, check_health=False)
    try:
        assert prefers_streaming({"p": server}) and backend_concurrency(server) == 48
        assert not prefers_streaming({"p": tiny_backend}) and backend_concurrency(tiny_backend) == 1
        assert not prefers_streaming({"p": server, "q": tiny_backend})  # an in-process policy: lockstep
    finally:
        server.close()
    from srpo_graph.backends.openai import OpenAIBackend
    from srpo_graph.workflow import ExternalModel

    external = OpenAIBackend(ExternalModel(url="http://127.0.0.1:9/v1", model="m", concurrency=12))
    try:
        assert prefers_streaming({"judge": external}) and backend_concurrency(external) == 12
    finally:
        external.close()
    with pytest.raises(Exception, match="scheduler must be"):
        run(wfs.coord_seq(), [], {"tiny": tiny_backend}, samples=1, scheduler="async")
