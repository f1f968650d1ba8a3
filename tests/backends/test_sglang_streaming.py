"""The streaming scheduler on a REAL SGLang server (CPU build; the ``sglang_url`` fixture).

``auto`` streams to the server: one ``generate`` call per episode wave, one HTTP call (the
server batches the requests of all episodes continuously), every episode completes, and the traces have the shape
of the lockstep run's (same agents, same sets; the tokens differ only where the server's
sampling does, since it is not in deterministic mode). Opt-in outside CI, like every
real-SGLang test (sglang_servers.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
ROOT = Path(__file__).resolve().parents[2]


def test_auto_streams_episodes_to_a_real_server(sglang_url, tiny_dir):
    from srpo_graph.backends import load_backend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task

    wf = load_workflow(ROOT / "workflows" / "coord_mixed.wf")  # wave {a, b}, then {c}
    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(8)]
    b = load_backend("sglang", str(tiny_dir), url=sglang_url)
    read, calls = b._read, []

    def spy(url, *a, **kw):  # counts the HTTP calls (a spy: each still reaches the server)
        calls.append(url)
        return read(url, *a, **kw)

    b._read = spy
    try:
        streamed = run(wf, tasks, {"tiny": b}, samples=4, seed=3)  # auto
        streamed_calls = len(calls)
        lock = run(wf, tasks, {"tiny": b}, samples=4, seed=3, scheduler="lockstep")
    finally:
        b.close()
    # a wave is one HTTP call (Note [A wave in one call]): {a, b} and {c} per episode; lockstep: one a request
    assert streamed_calls == 2 * 32 and len(calls) - streamed_calls == 3 * 32
    assert {e.status for e in streamed.episodes} == {"ok"} == {e.status for e in lock.episodes}
    assert streamed.stats.generate_calls == 2 * 32 and lock.stats.generate_calls == 2  # waves vs rounds
    for s, k in zip(streamed.episodes, lock.episodes):
        assert (s.task_id, s.sample) == (k.task_id, k.sample)
        assert [o.agent for o in s.outputs] == [o.agent for o in k.outputs] == ["a", "b", "c"]
        assert [(t.name, list(t.consumed)) for t in s.transitions] == [
            (t.name, list(t.consumed)) for t in k.transitions
        ]
        for o in s.outputs:
            assert len(o.completion_ids) == 1 and o.value is not None and o.logprobs[0] <= 0.0
            assert o.id == f"o{s.outputs.index(o)}"
    assert streamed.stats.tokens_generated == lock.stats.tokens_generated == 96
