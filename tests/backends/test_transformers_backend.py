"""TransformersBackend: log-probs vs an independent forward pass, constraints, stops, seeds."""

from __future__ import annotations

import math

import pytest
import torch

from srpo_graph.backends.base import Backend, GenerationRequest
from srpo_graph.errors import BackendError


def reference_logprobs(model, prompt, completion, temperature, allowed=None):
    """Plain slow reference: one forward pass over prompt + completion, one position at a time."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].double()
    out = []
    for j, tok in enumerate(completion):
        row = logits[len(prompt) - 1 + j] / (temperature if temperature > 0 else 1.0)
        ids = list(allowed) if allowed is not None else list(range(row.shape[0]))
        z = max(row[i].item() for i in ids)
        norm = z + math.log(sum(math.exp(row[i].item() - z) for i in ids))
        out.append(row[tok].item() - norm)
    return out


def enc(backend, s):
    return tuple(backend.tokenizer(s)["input_ids"])


def test_is_a_backend(tiny_backend):
    assert isinstance(tiny_backend, Backend)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("constrained", [False, True])
def test_logprobs_match_a_separate_forward_pass(tiny_backend, temperature, constrained):
    digits = tuple(tiny_backend.tokenizer.convert_tokens_to_ids(list("0123456789")))
    prompts = ["<a>3", "<b>12<sep>hello there", "<c>x", "<q>what is 4+5?"]  # different lengths: padding
    reqs = [
        GenerationRequest(enc(tiny_backend, p), max_new_tokens=7, temperature=temperature, seed=i,
                          allowed_token_ids=digits if constrained else None, top_k=5 if i == 2 else 0,
                          top_p=0.8 if i == 3 else 1.0)
        for i, p in enumerate(prompts)
    ]
    for req, comp in zip(reqs, tiny_backend.generate(reqs)):
        assert len(comp.completion_ids) == len(comp.logprobs) >= 1
        if constrained:
            assert set(comp.completion_ids) <= set(digits)
        ref = reference_logprobs(tiny_backend.model, req.prompt_ids, comp.completion_ids, temperature,
                                 digits if constrained else None)
        assert max(abs(a - b) for a, b in zip(ref, comp.logprobs)) < 1e-5


def test_top_k_one_is_greedy_and_greedy_is_argmax(tiny_backend):
    p = enc(tiny_backend, "<a>5<sep>abc")
    a, b = tiny_backend.generate([
        GenerationRequest(p, max_new_tokens=5, top_k=1, seed=1),
        GenerationRequest(p, max_new_tokens=5, temperature=0.0, seed=2),
    ])
    assert a.completion_ids == b.completion_ids
    with torch.no_grad():
        ids = list(p)
        for tok in b.completion_ids:
            assert tok == int(tiny_backend.model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)


def test_seeds_reproduce_independently_of_the_batch(tiny_backend):
    reqs = [GenerationRequest(enc(tiny_backend, f"<a>{i}" + "x" * i), max_new_tokens=6, seed=100 + i) for i in range(6)]
    together = tiny_backend.generate(reqs)
    alone = [tiny_backend.generate([r])[0] for r in reversed(reqs)][::-1]
    assert [c.completion_ids for c in together] == [c.completion_ids for c in alone]
    other_seed = tiny_backend.generate([GenerationRequest(r.prompt_ids, 6, seed=r.seed + 1) for r in reqs])
    assert [c.completion_ids for c in other_seed] != [c.completion_ids for c in together]


def test_rows_with_one_prompt_share_a_prefill_and_sample_as_if_alone(tiny_backend):
    """The G samples of a task share one prefill (its cache row repeated): each row's tokens are what it
    samples alone, its log-probs those of a separate forward pass, and one prefill row per distinct prompt."""
    prompts = [enc(tiny_backend, "<q>what is 4+5?"), enc(tiny_backend, "<a>3"), enc(tiny_backend, "<b>12<sep>hi")]
    reqs = [GenerationRequest(prompts[i % 3], max_new_tokens=6, temperature=1.3, seed=7 + i, top_k=4 if i == 4 else 0)
            for i in range(9)]  # three rows per prompt, interleaved, different lengths
    rows = []
    hook = tiny_backend.model.register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        together = tiny_backend.generate(reqs)
    finally:
        hook.remove()
    assert rows[0] == (3, max(len(p) for p in prompts))  # the prefill: one row per distinct prompt
    assert all(shape[0] == 9 and shape[1] == 1 for shape in rows[1:])  # then every row decodes
    alone = [tiny_backend.generate([r])[0] for r in reqs]
    assert [c.completion_ids for c in together] == [c.completion_ids for c in alone]
    from srpo_graph.backends.transformers import TransformersBackend

    unshared = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, share_prefill=False).generate(reqs)
    assert [c.completion_ids for c in unshared] == [c.completion_ids for c in together]
    assert len({c.completion_ids for c in together}) > 3  # rows of one prompt drew their own samples
    for req, comp in zip(reqs, together):
        ref = reference_logprobs(tiny_backend.model, req.prompt_ids, comp.completion_ids, 1.3)
        if req.top_k == 0:
            assert max(abs(a - b) for a, b in zip(ref, comp.logprobs)) < 1e-5


def test_shared_prefill_on_a_hybrid_linear_attention_model():
    """A model whose cache holds linear-attention states besides keys and values (Qwen3.5's hybrid
    layers): rows of one prompt share its prefill there too, and sample what they sample unshared."""
    import types

    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from srpo_graph.backends.transformers import TransformersBackend

    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2,
                            full_attention_interval=2, eos_token_id=63)
    model = Qwen3_5ForCausalLM(cfg).eval()
    tok = types.SimpleNamespace(eos_token_id=63, pad_token_id=0)
    reqs = [GenerationRequest((1, 2, 3, 4), max_new_tokens=5, seed=s) for s in range(3)] + [
        GenerationRequest((5, 6), max_new_tokens=5, seed=9), GenerationRequest((1, 2, 3, 4), max_new_tokens=5, seed=11)]
    shared, unshared = (TransformersBackend(model, tok, share_prefill=x).generate(reqs) for x in (True, False))
    assert [c.completion_ids for c in shared] == [c.completion_ids for c in unshared]
    assert len({c.completion_ids for c in shared}) > 2
    for a, b in zip(shared, unshared):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_stop_tokens_and_length(tiny_backend):
    tok = tiny_backend.tokenizer
    p = enc(tiny_backend, "<a>1")
    free = tiny_backend.generate([GenerationRequest(p, max_new_tokens=12, seed=s) for s in range(20)])
    target = free[0].completion_ids[2]  # a token this seed samples third: make it a stop token
    stopped = tiny_backend.generate([GenerationRequest(p, max_new_tokens=12, seed=0, stop_token_ids=(target,))])[0]
    cut = free[0].completion_ids.index(target) + 1
    assert stopped.completion_ids == free[0].completion_ids[:cut] and stopped.finish_reason == "stop"
    for c in free:
        if tok.eos_token_id in c.completion_ids:
            assert c.completion_ids[-1] == tok.eos_token_id and c.finish_reason == "stop"
        else:
            assert len(c.completion_ids) == 12 and c.finish_reason == "length"


def test_bad_requests_are_backend_errors(tiny_backend):
    with pytest.raises(BackendError, match="outside the vocabulary"):
        tiny_backend.generate([GenerationRequest((1, 10_000), max_new_tokens=2)])
    with pytest.raises(BackendError, match="max_new_tokens"):
        tiny_backend.generate([GenerationRequest((1,), max_new_tokens=0)])


def test_sync_weights_shared_object_and_copy(tiny_dir):
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends.transformers import TransformersBackend

    backend = TransformersBackend.from_pretrained(str(tiny_dir))
    backend.sync_weights(backend.model, 3)  # the trainer shares its model: only the tag changes
    assert backend.weight_version == 3
    other = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    backend.sync_weights(other, 4)
    assert backend.weight_version == 4 and backend.model is not other
    assert all(torch.equal(a, b) for a, b in zip(backend.model.state_dict().values(), other.state_dict().values()))
    assert backend.generate([GenerationRequest((1, 4), 1, seed=0)])[0].weight_version == 4


def test_load_backend_unknown_model_is_a_backend_error(tmp_path):
    from srpo_graph.backends import load_backend

    with pytest.raises(BackendError, match="cannot load model"):
        load_backend("transformers", str(tmp_path / "nothing-here"))


def test_samples_end_at_every_end_id_of_the_model(tmp_path):
    """The model config's eos, its generation_config's list (an instruct model's second end id,
    Qwen's ``<|endoftext|>``) and the tokenizer's eos all end a sample, as on SGLang
    (tests/backends/test_sglang_local_models.py checks both servers agree)."""
    from transformers import GenerationConfig

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.architectures import ensure_local_model

    path = ensure_local_model("qwen3-test", tmp_path / "qwen3-test")
    backend = TransformersBackend.from_pretrained(str(path))
    tok = backend.tokenizer
    extra = sorted(set(GenerationConfig.from_pretrained(str(path)).eos_token_id) - {tok.eos_token_id})
    assert extra and set(extra) <= set(backend.eos_ids) and tok.eos_token_id in backend.eos_ids
    word = tok.encode(" the", add_special_tokens=False)[0]
    prompt = tuple(tok.encode("What is 2 + 2?", add_special_tokens=False))
    for c in backend.generate([GenerationRequest(prompt, max_new_tokens=40, temperature=1.0,
                                                 allowed_token_ids=(word, *extra), seed=s) for s in range(6)]):
        assert [t in extra for t in c.completion_ids] == [False] * (len(c.completion_ids) - 1) + [True]
        assert c.finish_reason == "stop"
