"""What a backend answers is checked before it reaches a trace (issue 12, item 6).

The real tiny model samples; a thin wrapper then alters its answer the way a buggy or
mismatched server would (ids outside the vocabulary, negative ids, more tokens than
``max_new_tokens``). The run stops with a BackendError naming the request, the position and
the bound, instead of writing ids that later crash training (or an ``OverflowError``).
"""

from __future__ import annotations

import dataclasses

import pytest

from srpo_graph.errors import BackendError
from srpo_graph.runtime.executor import run
from tests.support import workflows as wfs


class Altering:
    """The real backend, with every completion passed through ``alter`` (as a faulty server would)."""

    def __init__(self, inner, alter):
        self.inner, self.alter = inner, alter
        self.tokenizer, self.weight_version = inner.tokenizer, inner.weight_version

    def generate(self, requests):
        return [self.alter(c) for c in self.inner.generate(requests)]

    def sync_weights(self, model, version):
        self.inner.sync_weights(model, version)

    def close(self):
        pass


def _ids(c, ids):
    return dataclasses.replace(c, completion_ids=tuple(ids), logprobs=tuple([-0.5] * len(ids)))


@pytest.mark.parametrize("alter, message", [
    (lambda c, v: _ids(c, [v + 5]), "is outside the vocabulary [0, {v})"),
    (lambda c, v: _ids(c, [v]), "is outside the vocabulary [0, {v})"),
    (lambda c, v: _ids(c, [-3]), "token id -3 at completion position 0 is outside the vocabulary"),
    (lambda c, v: _ids(c, [2**70]), "is outside the vocabulary"),
    (lambda c, v: _ids(c, [4.0]), "token id 4.0 at completion position 0 is a float, not an integer"),
    (lambda c, v: _ids(c, [5] * 50), "50 completion tokens for max_new_tokens 1"),
])
def test_bad_token_ids_from_a_backend_stop_the_run_clearly(tiny_backend, coord_tasks, alter, message):
    vocab = len(tiny_backend.tokenizer)
    backend = Altering(tiny_backend, lambda c: alter(c, vocab))
    with pytest.raises(BackendError, match="request '") as info:
        run(wfs.coord_seq(), coord_tasks[:2], {"tiny": backend}, samples=2, seed=0)
    assert message.format(v=vocab) in str(info.value)


def test_a_faithful_answer_passes_unchanged(tiny_backend, coord_tasks):
    backend = Altering(tiny_backend, lambda c: c)
    res = run(wfs.coord_seq(), coord_tasks[:2], {"tiny": backend}, samples=2, seed=0)
    vocab = len(tiny_backend.tokenizer)
    assert res.stats.episodes == 4
    assert all(0 <= t < vocab for ep in res.episodes for o in ep.outputs for t in o.completion_ids)
