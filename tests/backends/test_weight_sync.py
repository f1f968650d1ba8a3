"""Weights over a process group (srpo_graph/backends/weight_sync.py): buckets, the flattened
layout SGLang reads, the group's deadline with real gloo, and -- against REAL SGLang CPU servers
(marker ``sglang``) -- a sync whose served log-probs are the new weights', in one bucket or many,
and a server that stalls or dies mid-sync ending the sync with its URL named, never a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from srpo_graph.backends.ports import free_port
from srpo_graph.backends.weight_sync import (
    DistributedSync,
    buckets,
    flatten,
    http_call,
    join_group,
    named_weights,
)
from srpo_graph.errors import BackendError
from tests.support.ports import unanswered_port
from tests.support.sglang_checks import ATOL, client, perturbed, served_gap


def test_flattened_bucket_is_what_sglang_reconstructs():
    """The bytes back to back; cutting them at each tensor's byte offset (SGLang's
    FlattenedTensorBucket.reconstruct_tensors, re-written here as a plain loop) gives the tensors back."""
    torch.manual_seed(0)
    pairs = [("a", torch.randn(3, 4)), ("b", torch.randn(5)), ("c", torch.randn(2, 2, 2))]
    [bucket] = list(buckets(pairs, 1 << 20, torch.bfloat16))
    flat = flatten(bucket)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(t.numel() * 2 for _, t in pairs)
    offset = 0
    for name, t in pairs:
        n = t.numel() * 2
        back = flat[offset:offset + n].view(torch.bfloat16).reshape(t.shape)
        assert torch.equal(back, t.to(torch.bfloat16)), name
        offset += n


def test_buckets_respect_the_bound_and_keep_order():
    pairs = [(f"w{i}", torch.zeros(i + 1)) for i in range(20)]
    out = list(buckets(pairs, 32, None))
    assert [n for b in out for n, _ in b] == [n for n, _ in pairs]
    for b in out:  # within the bound, or one tensor larger than it alone
        assert sum(t.numel() * 4 for _, t in b) <= 32 or len(b) == 1


def test_named_weights_send_a_tied_embedding_once(tiny_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    names = [n for n, _ in named_weights(m)]
    assert len(names) == len(set(names))
    tied = m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    assert ("lm_head.weight" in names) != tied  # the saved names: a tied head is the embedding
    assert sum(t.numel() for _, t in named_weights(m)) == sum(p.numel() for p in m.parameters())


def test_a_group_nobody_joins_ends_at_its_deadline():
    """Rank 0 of a real gloo group whose other rank never comes: an error naming the address, no hang."""
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=f"127.0.0.1:{port}"):
        join_group("127.0.0.1", port, 2, f"nobody-{port}", "gloo", timeout=2.0)
    assert time.monotonic() - t0 < 60


def test_a_server_that_cannot_join_is_named_within_the_deadline():
    """A worker URL where no server listens: the first call fails at once, naming the URL."""
    sync = DistributedSync(timeout=3.0)
    with unanswered_port() as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(BackendError, match=url):
            sync.connect(url)
    sync.close()


# --------------------------------------------------------------------------- real SGLang servers


@pytest.mark.sglang
def test_distributed_sync_serves_the_new_weights_in_one_bucket_or_many(sglang_url, tiny_dir, tmp_path):
    """After a process-group sync the real server's log-probs are the new weights' (bf16
    tolerance), and its weight version is the sync's; 1 bucket or ~40 give the same; nothing is
    written to disk. The session server gets its original weights back at the end."""

    from srpo_graph.models.tiny import load_tokenizer

    tok = load_tokenizer(str(tiny_dir))
    prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(4)]
    original = perturbed(tiny_dir, scale=0.0)
    other = perturbed(tiny_dir)
    b = client(sglang_url, tiny_dir, weight_dir=tmp_path / "w", sync="distributed")
    try:
        b.sync_weights(other, 21)
        gap, versions = served_gap(b, other, prompts)
        assert versions == {21} and gap < ATOL
        assert served_gap(b, original, prompts)[0] > 3 * ATOL  # it serves the new weights, not the old
        assert b._streamer.stats["buckets"] == 1
        many = client(sglang_url, tiny_dir, weight_dir=tmp_path / "w2", sync="distributed",
                      sync_options={"bucket_bytes": 4096})
        try:
            other2 = perturbed(tiny_dir, seed=2)
            many.sync_weights(other2, 22)
            assert many._streamer.stats["buckets"] > 10
            gap, versions = served_gap(many, other2, prompts)
            assert versions == {22} and gap < ATOL
        finally:
            many.sync_weights(original, 23)  # leave the session server as it was
            many.close()
        assert not (tmp_path / "w").exists() and not (tmp_path / "w2").exists()  # no disk route taken
    finally:
        b.close()


@pytest.mark.sglang
@pytest.mark.parametrize("sync", ["disk", "distributed"])
def test_the_update_itself_flushes_the_prefix_cache(sglang_url, tiny_dir, tmp_path, sync):
    """A prompt the real server had cached is computed afresh after a sync (its prefix cache held
    KV of the old weights), and the update flushed it itself: no ``/flush_cache`` call, whose
    ``gc.collect()`` cost ~0.45 s a sync on CPU (Note [The update flushes the cache]). The calls
    are recorded by wrapping the backend's own HTTP read (a spy: every call still reaches the server)."""
    import httpx

    prompt = list(range(3, 40))

    def cached() -> int:
        answer = httpx.post(f"{sglang_url}/generate", timeout=60,
                            json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}).json()
        return int(answer["meta_info"]["cached_tokens"])

    routes: list[str] = []

    def post(worker, route, payload, timeout):  # the process-group route's calls
        routes.append(route)
        return http_call(worker, route, payload, timeout)

    b = client(sglang_url, tiny_dir, weight_dir=tmp_path / "w", sync=sync, sync_options={"post": post})
    read = b._read

    def spy(url, *a, **kw):  # the disk route's calls
        routes.append(url.removeprefix(sglang_url))
        return read(url, *a, **kw)

    b._read = spy
    try:
        cached()
        assert cached() > 0  # the server caches the prompt's prefix
        b.sync_weights(tiny_dir if sync == "disk" else perturbed(tiny_dir, scale=0.0), 31)  # the same weights
        assert cached() == 0, "a prefix cached before the sync was reused after it"
        assert not [r for r in routes if r.startswith("/flush_cache")], routes
        assert ("/update_weights_from_disk" if sync == "disk" else "/update_weights_from_distributed") in routes
    finally:
        b.close()


@pytest.mark.sglang
def test_a_server_that_stalls_or_dies_mid_sync_ends_it_with_its_url(tmp_path, tiny_dir):
    """A real server stopped (SIGSTOP) after the first bucket: the next bucket ends at the
    sync deadline with an error naming the server; the same server killed (SIGKILL): the next
    sync fails at once, naming it. The signals are sent from the HTTP hook between two buckets,
    so the fault lands mid-sync, on a real server."""
    from srpo_graph.backends import load_backend
    from tests.support.sglang_servers import start_real_server

    server = start_real_server(tiny_dir, tmp_path)
    pid = server.proc.pid
    answered = {"n": 0}

    def post(worker, route, payload, timeout):
        out = http_call(worker, route, payload, timeout)
        if route == "/update_weights_from_distributed":
            answered["n"] += 1
            if answered["n"] == 2:
                os.killpg(os.getpgid(pid), signal.SIGSTOP)  # stalls: the process group, every SGLang process
        return out

    try:
        b = load_backend("sglang", str(tiny_dir), url=server.url, weight_dir=tmp_path / "w", sync="distributed",
                         sync_options={"bucket_bytes": 4096, "timeout": 8.0, "post": post})
        model = perturbed(tiny_dir)
        t0 = time.monotonic()
        with pytest.raises(BackendError, match=server.url.replace(".", r"\.")):
            b.sync_weights(model, 1)
        assert time.monotonic() - t0 < 60  # the deadline (8 s a bucket), not a hang
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        server.proc.wait(30)
        t0 = time.monotonic()
        with pytest.raises(BackendError, match=server.url.replace(".", r"\.")):
            b.sync_weights(model, 2)
        assert time.monotonic() - t0 < 60
        b.close()
    finally:
        try:
            os.killpg(os.getpgid(pid), signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        server.stop()
