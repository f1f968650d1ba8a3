"""The real SGLang CPU server serves the Qwen3- and Llama 3-shaped models built here
(srpo_graph/models/architectures.py) with their byte-level BPE tokenizers: prompts rendered
through each family's chat template go in as token ids, completion ids and log-probs come back,
the log-probs match the trainer's fp32 forward (bf16 server, ATOL as in test_sglang_real.py), and a
turn ends at the template's end-of-turn token.

Opt-in outside CI like every real-SGLang test (SRPO_GRAPH_SGLANG=1); one server per family, both
started together (their start-ups overlap) and shared with test_sglang_chat.py (conftest.py::local_sglang).
"""

from __future__ import annotations

import pytest
import torch

from srpo_graph.backends.base import GenerationRequest
from srpo_graph.backends.sampling import scaled_logprobs
from tests.support.sglang_checks import ATOL

pytestmark = pytest.mark.sglang
NAMES = SGLANG_MODELS = ("qwen3-test", "llama3-test")


@pytest.fixture(scope="module")
def served(local_sglang):
    """{name: (model folder, its real server)} for each family (the session's shared servers,
    started together: conftest.py::local_sglang)."""
    return {name: local_sglang(name) for name in NAMES}


def _reference(model, prompt, completion, temperature, allowed=None):
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1]
    mask = None
    if allowed is not None:
        mask = torch.zeros_like(logits, dtype=torch.bool)
        mask[:, list(allowed)] = True
    lp = scaled_logprobs(logits, torch.full((logits.shape[0],), float(temperature)), mask)
    return lp.gather(1, torch.tensor(list(completion))[:, None]).squeeze(1)


@pytest.mark.parametrize("name", NAMES)
def test_sglang_serves_the_local_chat_models_token_in_token_out(name, served):
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends import load_backend
    from srpo_graph.models.chat_templates import FAMILIES
    from srpo_graph.models.tiny import load_tokenizer

    path, server = served[name]
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    eot = tok.convert_tokens_to_ids(FAMILIES[name.split("-")[0]].eos)
    prompts = []
    for i in range(4):
        ids = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": f"What is {i} + {i}?"}],
                                      tokenize=True, add_generation_prompt=True)
        prompts.append(tuple(ids["input_ids"] if hasattr(ids, "keys") else ids))
    b = load_backend("sglang", str(path), url=server.url, backoff=0.05)
    reqs = [GenerationRequest(p, max_new_tokens=6, temperature=t) for p in prompts for t in (1.0, 0.7)]
    gaps = []
    for r, c in zip(reqs, b.generate(reqs)):
        assert 1 <= len(c.completion_ids) <= 6 and len(c.logprobs) == len(c.completion_ids)
        gaps.append(float((torch.tensor(c.logprobs) - _reference(model, r.prompt_ids, c.completion_ids,
                                                                   r.temperature)).abs().max()))
    assert max(gaps) < ATOL, gaps
    # a turn ends at the end-of-turn token: allowed {a word, end of turn}, so it comes soon
    word = tok.encode(" the", add_special_tokens=False)[0]
    allowed = (word, eot)
    ends = b.generate([GenerationRequest(p, max_new_tokens=40, temperature=1.0, allowed_token_ids=allowed,
                                         stop_token_ids=(eot,)) for p in prompts])
    for p, c in zip(prompts, ends):
        assert set(c.completion_ids) <= set(allowed)
        assert c.completion_ids[-1] == eot and eot not in c.completion_ids[:-1], c.completion_ids
        ref = _reference(model, p, c.completion_ids, 1.0, allowed)
        assert (torch.tensor(c.logprobs) - ref).abs().max() < ATOL
    b.close()



@pytest.mark.parametrize("name", NAMES)
def test_both_backends_end_a_sample_at_the_generation_configs_extra_end_ids(name, served):
    """An instruct model's ``generation_config`` lists more end ids than its tokenizer's eos
    (Qwen: ``<|endoftext|>`` beside ``<|im_end|>``). SGLang stops at all of them unasked; the
    transformers backend must too, or the two backends sample different episodes."""
    from transformers import GenerationConfig

    from srpo_graph.backends import load_backend
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.tiny import load_tokenizer

    path, server = served[name]
    tok = load_tokenizer(path)
    extra = sorted(set(GenerationConfig.from_pretrained(str(path)).eos_token_id) - {tok.eos_token_id})
    assert extra, "the local models list a second end id in generation_config"
    word = tok.encode(" the", add_special_tokens=False)[0]
    allowed = (word, *extra)
    prompt = tuple(tok.encode("What is 2 + 2?", add_special_tokens=False))
    reqs = [GenerationRequest(prompt, max_new_tokens=40, temperature=1.0, allowed_token_ids=allowed, seed=s)
            for s in range(6)]
    served_b = load_backend("sglang", str(path), url=server.url, backoff=0.05)
    try:
        for backend in (served_b, TransformersBackend.from_pretrained(str(path))):
            for c in backend.generate(reqs):
                ends = [i for i, t in enumerate(c.completion_ids) if t in extra]
                assert ends == [len(c.completion_ids) - 1], (type(backend).__name__, c.completion_ids)
    finally:
        served_b.close()
