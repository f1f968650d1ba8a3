"""Helpers of the real-SGLang test files (tests/backends): a client of a running server, the
trainer's reference log-probs, the server/trainer gap, and perturbed copies of the tiny model."""

from __future__ import annotations

import torch

from srpo_graph.backends.base import GenerationRequest
from srpo_graph.backends.sampling import scaled_logprobs

ATOL = 0.03  # nats per token, bf16 server vs fp32 trainer


def client(url, tiny_dir, **kw):
    """A backend on a server its fixture already waited healthy for: no health check of its own
    (SGLang's ``/health`` sleeps a whole second before it looks; ~20 clients of the real-server
    tests, one after another on one worker, spent ~20 s there)."""
    from srpo_graph.backends import load_backend

    kw.setdefault("backoff", 0.05)
    kw.setdefault("check_health", False)
    return load_backend("sglang", str(tiny_dir), url=url, **kw)


def reference_logprobs(model, prompt, completion, temperature, allowed=None):
    """The trainer's log-probs of ``completion`` after ``prompt`` (fp32, one forward)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1]  # [C, V]: the logits that produced each token
    mask = None
    if allowed is not None:
        mask = torch.zeros_like(logits, dtype=torch.bool)
        mask[:, list(allowed)] = True
    t = torch.full((logits.shape[0],), float(temperature))
    lp = scaled_logprobs(logits, t, mask)
    return lp.gather(1, torch.tensor(list(completion))[:, None]).squeeze(1)


def served_gap(backend, model, prompts, n=4):
    """Largest |server log-prob − trainer log-prob| over sampled completions of ``prompts``."""
    comps = backend.generate([GenerationRequest(p, n, temperature=1.0) for p in prompts])
    gap = max(float((torch.tensor(c.logprobs) - reference_logprobs(model, p, c.completion_ids, 1.0)).abs().max())
              for p, c in zip(prompts, comps))
    return gap, {c.weight_version for c in comps}


def perturbed(tiny_dir, scale=0.05, seed=1):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * scale)
    return m
