"""A chat recipe on an exact released vocabulary (``policy p = "qwen3-realvocab-math"``; models stage).

Consumes a :class:`~srpo_graph.models.recipes.Recipe` whose ``family`` names an exact tokenizer of
vocab.py (Qwen3's: 151,669 tokens) and produces a model directory shaped like ``released.py``'s
test-width models -- the released ``config.json`` at a small width, ``Qwen3ForCausalLM``, the exact
tokenizer files and chat template -- but *pre-trained* here, by SFT on the tiny math problems of
sft_data.py rendered as chat turns with the family's template:

    <|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n
    -> 3+4=7;7-2=5;#5<|im_end|>

exactly the prompt a chat agent with ``system: SYSTEM`` and ``prompt: "{task.question}"`` sends
(runtime/chat.py), so ``workflows/chat_math_qwen3.wf`` starts RL from a model that half-knows the
task. The targets are the imperfect teacher's (sft_data.py, Note [An imperfect teacher]): a slipped
step, a missing ``#answer``; held-out problems are never seen.

Note [Training the rows the data uses]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The 151,669-row embedding (tied with the head) is ~95% of the parameters and, trained in full,
~all of the SFT's time: every position's softmax runs over 151k logits. The synthetic chat uses a
few hundred ids (digits, ``+-=;#``, the names and words of the problems, the template's markup).
So SFT trains a model whose vocabulary is those ``U`` ids plus one row ``u`` standing for each of
the ``V - U`` others: in the built model every other row *is* ``u``, so each has the logit
``h·u`` and together they hold mass ``(V-U)·e^(h·u)``. The SFT's last logit, ``h·u + log(V-U)``,
is therefore the full model's softmax, exactly: the SFT loss is the loss of the 151,669-way model
whose unused rows are ``u``, and it teaches the model to put no mass on them (the built model
records that mass on held-out turns: ``unused_mass``). After SFT the trained rows go to their ids
and ``u`` to every other id. The model's vocabulary is the tokenizer's size, so it has no id the
tokenizer cannot decode.

Why not zero rows (version 1 did that, with the pooled logit fixed at ``log(V-U)``): the rows are
tied, so a zero head row is also a zero *input* embedding, and RMSNorm divides its input by
``sqrt(mean(x²) + eps)``: at ``x = 0`` that is ``sqrt(eps) = 1e-3``, so the gradient reaching a
zero row is ~1,000 times a trained row's. An unused id sampled once (0.05% of the mass per
position: about one step in five at 8 x 4 episodes) then fed back as the next position's input
made RL's gradient norm 160-4,250 on that row alone (3-6 otherwise), and the global clip shrank
the whole update by as much. ``u`` is a trained, non-zero row: its norm is the trained rows'.
Deterministic for the recipe's seed (one thread, fixed data order); ``recipes.ensure_recipe_model``
makes the build atomic and caches it like the other recipes.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from srpo_graph.models.sft_data import is_held_out, math_problem, solution

# the agent's system prompt in workflows/chat_math_qwen3.wf, exactly
SYSTEM = "Solve the problem step by step. End with #ANSWER."
# the recipe's width: tiny-reason's (recipes.py), which learns these problems, with Qwen3's grouped heads
WIDTH: dict[str, Any] = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                             intermediate_size=384, num_hidden_layers=3, max_position_embeddings=1024)
NUM_CHECK = 64  # held-out turns the build measures the unused ids' mass on


def chat_messages(question: str) -> list[dict[str, str]]:
    """The first turn's messages of the math chat agent: the system prompt, then the question.

    >>> [m["role"] for m in chat_messages("3+4")]
    ['system', 'user']
    """
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def chat_math_examples(rng: random.Random, num: int) -> list[tuple[str, str]]:
    """``num`` (question, completion) pairs: the imperfect teacher's solutions, no held-out problem.

    >>> chat_math_examples(random.Random(0), 2)[1]
    ('eva has 5 books, gets 2 more. how many now?', '5+2=7;#7')
    """
    out: list[tuple[str, str]] = []
    while len(out) < num:
        p = math_problem(rng)
        if not is_held_out(p.question):
            out.append((p.question, solution(p, rng)))
    return out


def held_out_examples(rng: random.Random, num: int) -> list[tuple[str, str]]:
    """``num`` held-out (question, correct solution) pairs (for the build's check, never trained on)."""
    out: list[tuple[str, str]] = []
    while len(out) < num:
        p = math_problem(rng)
        if is_held_out(p.question):
            out.append((p.question, solution(p)))
    return out


def encode_pairs(tok: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """(ids, number of prompt ids) per pair: the chat prompt as the runtime renders and encodes it
    (template with the generation prompt, no added specials), the completion, then end-of-turn."""
    prompts: dict[str, list[int]] = {}
    seqs = []
    for question, completion in pairs:
        if question not in prompts:
            text = tok.apply_chat_template(chat_messages(question), tokenize=False, add_generation_prompt=True)
            prompts[question] = tok(text, add_special_tokens=False)["input_ids"]
        p_ids = prompts[question]
        seqs.append((p_ids + tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id], len(p_ids)))
    return seqs


def used_ids(tok: Any, seqs: list[tuple[list[int], int]]) -> list[int]:
    """The ids the SFT data uses, with every special and added token of the tokenizer, sorted."""
    ids = {i for s, _ in seqs for i in s} | set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    return sorted(ids)


def pooled_loss(num_unused: int) -> Callable:
    """The loss of Note [Training the rows the data uses]: next-token cross-entropy over the SFT model's
    ``U + 1`` logits, the last (row ``u``) raised by ``log(num_unused)``: the mass of ``num_unused``
    rows equal to ``u``."""
    pool = math.log(num_unused)

    def loss_of(model, ids, attn, labels):
        import torch

        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, T-1, U+1)
        logits = logits + torch.cat([torch.zeros_like(logits[0, 0, :-1]), logits.new_full((1,), pool)])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)

    return loss_of


def config_dict(family: str, vocab_size: int) -> dict[str, Any]:
    """The released ``config.json`` of ``family`` at the recipe's width, float32."""
    from srpo_graph.models.released import RELEASED_CONFIGS

    return {**RELEASED_CONFIGS[family], **WIDTH, "vocab_size": vocab_size, "torch_dtype": "float32",
            "use_cache": True}


def _model(cfg: dict[str, Any]):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    config = AutoConfig.for_model(**fields)
    return AutoModelForCausalLM.from_config(config)


def widen(model, used: list[int], cfg: dict[str, Any]):
    """The full-vocabulary model (config ``cfg``) of an SFT model over the ids ``used`` and one more row
    ``u``: row ``used[i]`` is the trained row ``i``, every other row ``u`` (the SFT model's last row;
    Note [Training the rows the data uses])."""
    state = dict(model.state_dict())
    small = state["model.embed_tokens.weight"]  # (U + 1, H)
    assert small.shape[0] == len(used) + 1, (small.shape, len(used))
    emb = small[-1].expand(cfg["vocab_size"], -1).clone()
    emb[used] = small[:-1]
    state["model.embed_tokens.weight"] = emb
    state.pop("lm_head.weight", None)  # tied: the embedding is the head
    full = _model(cfg)
    missing, unexpected = full.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    full.tie_weights()
    return full.eval()


def unused_mass(model, seqs: list[tuple[list[int], int]], used: list[int]) -> tuple[float, float]:
    """Mean and largest softmax mass on the ids outside ``used``, over the completion positions of ``seqs``."""
    import torch

    keep = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    keep[used] = True
    masses = []
    with torch.no_grad():
        for s, n_prompt in seqs:
            logits = model(input_ids=torch.tensor([s])).logits[0, n_prompt - 1 : len(s) - 1]  # (C, V)
            masses.append(torch.softmax(logits.float(), dim=-1)[:, ~keep].sum(-1))
    m = torch.cat(masses)
    return float(m.mean()), float(m.max())


def pretrain_chat(r: Any, log: Callable[[str], None] | None = None, steps: int | None = None):
    """SFT recipe ``r`` (``r.family`` set) on its exact tokenizer (Note [Training the rows the data
    uses]) on one thread; ``steps`` overrides the budget (tests). Returns (model, tokenizer, info)."""
    import torch

    from srpo_graph.models.sft import sft_steps
    from srpo_graph.models.vocab import load_vocab_tokenizer

    tok = load_vocab_tokenizer(r.family)
    num_steps = r.steps if steps is None else steps
    rng = random.Random(r.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic, and polite on a shared machine
    t0 = time.perf_counter()
    try:
        seqs = encode_pairs(tok, r.examples(rng, r.num_examples))
        used = used_ids(tok, seqs)
        local = {g: i for i, g in enumerate(used)}
        small = [([local[i] for i in s], n) for s, n in seqs]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(r.seed)
            # (the small model's vocabulary is local ids: the released bos/eos ids are not in it)
            model = _model({**config_dict(r.family, len(used) + 1), "bos_token_id": None, "eos_token_id": None})
            model.config.use_cache = False
            losses = sft_steps(model, small, local[tok.pad_token_id], num_steps, r.lr, r.batch_size, rng, log,
                               loss_of=pooled_loss(len(tok) - len(used)))
        full = widen(model, used, config_dict(r.family, len(tok)))
        check = encode_pairs(tok, held_out_examples(random.Random(r.seed + 1), NUM_CHECK))
        mean_mass, max_mass = unused_mass(full, check, used)
    finally:
        torch.set_num_threads(threads)
    info = {
        "recipe": r.name,
        "version": r.version,
        "seed": r.seed,
        "family": r.family,
        "parameters": sum(p.numel() for p in full.parameters()),
        "vocab_size": len(tok),
        "trained_rows": len(used),
        "steps": num_steps,
        "examples": len(seqs),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "unused_mass": {"mean": mean_mass, "max": max_mass},
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    return full, tok, info


def write_chat_recipe(r: Any, target: Path, log: Callable[[str], None] | None = None,
                      steps: int | None = None) -> dict[str, Any]:
    """Build recipe ``r`` into the (empty) folder ``target``: weights, ``config.json``, a generation
    config that samples from the model's own distribution, and the exact tokenizer's files as
    vocab.py wrote them. Returns what the build measured (``recipes.MARKER`` gets it)."""
    from srpo_graph.models.released import RELEASED_GENERATION
    from srpo_graph.models.vocab import MARKER as VOCAB_MARKER
    from srpo_graph.models.vocab import ensure_vocab_tokenizer

    model, _, info = pretrain_chat(r, log, steps)
    model.save_pretrained(target)
    gen = {**RELEASED_GENERATION[r.family], "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 64}
    (target / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    tok_dir = ensure_vocab_tokenizer(r.family)
    for f in tok_dir.iterdir():
        if f.is_file() and f.name != VOCAB_MARKER:
            shutil.copy2(f, target / f.name)
    info["tokenizer"] = json.loads((tok_dir / VOCAB_MARKER).read_text(encoding="utf-8"))
    return info
