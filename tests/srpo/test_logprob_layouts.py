"""The micro-batch layout of the log-prob forward (packed row, length-bucketed padded rows, shared
prompts through the KV cache) changes nothing but speed: same log-probs, entropies, losses and
gradients to ~1e-6, checked against a slow one-member-at-a-time reference, on members with
distinct prompts and on members that share them (the G samples of a task), and the bucketing is
the optimum it claims.

Models: the built-in tiny model and a smaller LlamaConfig model made here (two policies).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.forwards import length_buckets
from srpo_graph.srpo.logprobs import choose_layout, packed_logprobs
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from tests.support.models import NoCache, NoKeep, tiny_and_small

# the layouts under test: (layout, bucket_overhead); overhead 0 = a bucket per distinct
# length, a huge overhead = one padded bucket per policy
LAYOUTS = [("packed", 0), ("padded", 0), ("padded", 16), ("padded", 128), ("padded", 10**9),
           ("prefix", 0), ("prefix", 128), ("prefix", 10**9)]


REAL_SHARING = {}  # the prefix layout's real thresholds, for the tests that run with them


@pytest.fixture(autouse=True)
def small_sharing(monkeypatch):
    """The prefix layout shares what these small batches share (a node where it saves one token, a
    tree whatever it saves), so its tree path runs on them; tests that want the real thresholds
    put back ``REAL_SHARING``."""
    import srpo_graph.srpo.prefix_tree as tree_mod

    REAL_SHARING.update(MIN_SHARED_TOKENS=tree_mod.MIN_SHARED_TOKENS, MAX_TREE_SHARE=tree_mod.MAX_TREE_SHARE)
    monkeypatch.setattr(tree_mod, "MIN_SHARED_TOKENS", 1)
    monkeypatch.setattr(tree_mod, "MAX_TREE_SHARE", 1.0)


def _real_sharing(monkeypatch):
    import srpo_graph.srpo.prefix_tree as tree_mod

    for name, value in REAL_SHARING.items():
        monkeypatch.setattr(tree_mod, name, value)


@pytest.fixture(scope="module")
def models():
    """The built-in tiny model (Llama) and a small Qwen2 (biased q/k/v projections, grouped kv heads)."""
    return tiny_and_small("qwen2")


def _share_prompts(eps):
    """Episodes whose prompts start alike: the outputs of one task and position share a prompt (the G
    samples of a task; the members of a parallel set too where ``j`` is even), every prompt of a task
    starts with the task's 10 tokens and a step-0 prompt is just those (a later turn extends it), two
    tasks have the same prompts, and one member's prompt is its own."""
    out = []
    for e in eps:
        task = int(e.task_id[4:]) % 2  # task0 and task2 get the same prompts: groups across tasks
        base = [(13 * task + 3 * i) % 50 + 1 for i in range(10)]
        outputs = []
        for o in e.outputs:
            step, j = (int(x) for x in o.id[1:].split("_"))
            if step == 2 and e.sample == 0:  # a member whose prompt nobody shares: the padded path
                outputs.append(o)
                continue
            tail = [(31 * step + 17 * (j // 2) + 7 * i) % 50 + 1 for i in range((5 * step + 3 * (j // 2)) % 9)]
            outputs.append(o.model_copy(update={"prompt_ids": base + tail}))
        out.append(e.model_copy(update={"outputs": outputs}))
    return out


@pytest.fixture(scope="module", params=["distinct prompts", "shared prompts"])
def batch(models, request):
    """Two policies, constrained and temperature-scaled members, lengths 3..30, micro-batches; members'
    prompts all distinct, or shared by the samples of a task and the members of a set."""
    eps = synthetic_episodes(3, 3, seed=7, vocab=models[0].config.vocab_size, policies=("tiny", "small"),
                             prompt_len=(2, 18), completion_len=(1, 12))
    if request.param == "shared prompts":
        eps = _share_prompts(eps)
    b = compile(eps, CompileConfig(micro_batch_tokens=120))
    lengths = (b.member_offsets[1:] - b.member_offsets[:-1]).tolist()
    assert b.num_micro_batches > 1 and len(set(lengths)) > 5
    assert (
        (b.member_allowed >= 0).any() and (b.member_temperature != 1).any() and len(set(b.member_policy.tolist())) == 2
    )
    if request.param == "shared prompts":  # shared prompts of both policies, one-token completions, lone members
        from srpo_graph.srpo.prefix_tree import prefix_tree

        nodes = [
            sum(1 for k in prefix_tree(m, torch.arange(m.num_members), 1).children if k) for m in b.micro_batches()
        ]
        assert sum(n > 0 for n in nodes) >= len(nodes) / 2, nodes
        for pol in (0, 1):
            assert any(prefix_tree(b, (b.member_policy == pol).nonzero().squeeze(1), 1).children), pol
        tree = prefix_tree(b, torch.arange(b.num_members), 1)
        under = [sum(1 for m in tree.last if g in tree.path(m)) for g in range(len(tree.start))]
        assert max(under) >= 4 and 1 in under  # a node shared by 4 or more, a member's own tail
        assert any(under[tree.last[m]] > 1 for m in tree.last)  # a member's whole input shared (it has no tail)
        completion = [
            int(b.loss_mask[int(b.member_offsets[m]) : int(b.member_offsets[m + 1])].sum())
            for m in range(b.num_members)
        ]
        assert 1 in completion and max(completion) > 5
    return b


def reference_logprobs(models, b) -> tuple[torch.Tensor, torch.Tensor]:
    """One member at a time, no packing or padding, float64 log-softmax: [T] log-probs, entropies."""
    lp = torch.zeros(b.num_tokens, dtype=torch.float64)
    ent = torch.zeros(b.num_tokens, dtype=torch.float64)
    vals, ents, where = [], [], []
    for m in range(b.num_members):
        s, e = int(b.member_offsets[m]), int(b.member_offsets[m + 1])
        logits = models[int(b.member_policy[m])](input_ids=b.input_ids[s:e].unsqueeze(0)).logits[0].double()
        logits = logits / float(b.member_temperature[m])
        a = int(b.member_allowed[m])
        if a >= 0:
            allow = torch.zeros(logits.shape[1], dtype=torch.bool)
            allow[b.allowed(a)] = True
            logits = logits.masked_fill(~allow, float("-inf"))
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(s + 1, e):
            if b.loss_mask[t]:
                row = logp[t - s - 1]
                p = row.exp()
                vals.append(row[int(b.input_ids[t])])
                ents.append(float(-(p[p > 0] * row[p > 0]).sum().detach()))
                where.append(t)
    idx = torch.tensor(where, dtype=torch.int64)
    lp = lp.index_put((idx,), torch.stack(vals))
    ent = ent.index_put((idx,), torch.tensor(ents, dtype=torch.float64))
    return lp, ent


def _grads(models) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for m in models for p in m.parameters()]


def _zero(models) -> None:
    for m in models:
        m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("layout,overhead", LAYOUTS)
def test_every_layout_equals_the_one_member_reference(models, batch, layout, overhead):
    with torch.no_grad():
        want_lp, want_ent = reference_logprobs(models, batch)
        lp, ent = packed_logprobs(models, batch, layout=layout, bucket_overhead=overhead)
        # micro-batch by micro-batch (contiguous slices of the stream): the same values
        by_micro = torch.cat(
            [
                packed_logprobs(models, micro, layout=layout, bucket_overhead=overhead)[0]
                for micro in batch.micro_batches()
            ]
        )
    assert torch.allclose(by_micro, lp, atol=1e-6)
    mask = batch.loss_mask
    assert torch.allclose(lp.double()[mask], want_lp[mask], atol=2e-6)
    assert torch.allclose(ent.double()[mask], want_ent[mask], atol=2e-6)
    assert torch.all(lp[~mask] == 0) and torch.all(ent[~mask] == 0)


def test_loss_and_gradients_do_not_depend_on_the_layout(models, batch):
    """The SRPO loss of a whole step (every micro-batch, one fixed denominator) and the
    gradients of both policies: packed vs padded vs other bucketings, and the slow reference."""
    cfg = LossConfig()
    with torch.no_grad():  # pi_old a little away from pi, so ratios differ from 1 and clipping acts
        old, _ = reference_logprobs(models, batch)
    g = torch.Generator().manual_seed(3)
    b = batch.with_(old_logprobs=(old.float() + 0.05 * torch.randn(batch.num_tokens, generator=g)) * batch.loss_mask)
    denom = loss_denominator(b, cfg)
    results = {}
    for layout, overhead in LAYOUTS:
        _zero(models)
        total = 0.0
        for micro in b.micro_batches():
            lp, ent = packed_logprobs(models, micro, layout=layout, bucket_overhead=overhead)
            loss, _ = srpo_loss(lp, micro, cfg, denominator=denom, entropy=ent)
            loss.backward()
            total += float(loss.detach())
        results[(layout, overhead)] = (total, _grads(models))
    # the reference: one member at a time, float64 log-softmax, the whole batch in one loss call
    _zero(models)
    ref_lp, _ = reference_logprobs(models, b)
    ref_loss, _ = srpo_loss(ref_lp.float(), b, cfg, denominator=denom)
    ref_loss.backward()
    ref_grads = _grads(models)
    _zero(models)
    base_loss, base_grads = results[("packed", 0)]
    assert any(g.abs().sum() > 0 for g in base_grads[: len(list(models[0].parameters()))])
    assert any(g.abs().sum() > 0 for g in base_grads[len(list(models[0].parameters())) :])
    for key, (loss, grads) in results.items():
        assert loss == pytest.approx(base_loss, abs=1e-6), key
        assert loss == pytest.approx(float(ref_loss.detach()), abs=1e-5), key
        for got, want, ref in zip(grads, base_grads, ref_grads):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), key
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4), key


def test_padded_layout_without_logits_to_keep(models, batch):
    with torch.no_grad():
        a, _ = packed_logprobs(models, batch, layout="padded")
        b, _ = packed_logprobs([NoKeep(m) for m in models], batch, layout="padded")
    assert torch.allclose(a, b, atol=1e-6)


def test_auto_picks_packed_for_varlen_attention_and_prefix_for_a_cache(models):
    tiny = models[0]
    assert tiny.config._attn_implementation == "sdpa"
    assert choose_layout(tiny) == "prefix"
    assert choose_layout(NoKeep(tiny)) == "padded" and choose_layout(NoCache(tiny)) == "padded"
    assert choose_layout(NoCache(tiny), "prefix") == "padded"  # asked of a model without a cache
    assert choose_layout(tiny, "packed") == "packed" and choose_layout(tiny, "padded") == "padded"
    assert choose_layout(models[1]) == "prefix"  # Qwen2 with its sliding window off
    from transformers import MistralConfig, MistralForCausalLM

    windowed = MistralForCausalLM(
        MistralConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=4,
        )
    )
    assert choose_layout(windowed) == "padded" and choose_layout(windowed, "prefix") == "padded"
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hybrid = Qwen3_5ForCausalLM(
        Qwen3_5TextConfig(  # linear-attention layers: a state the prefix padding would enter
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            full_attention_interval=2,
        )
    )
    assert choose_layout(hybrid) == "padded" and choose_layout(hybrid, "prefix") == "padded"
    # transformers turns the KV cache off under activation (gradient) checkpointing, in training
    enable, disable = (
        ("activation_checkpointing_enable", "activation_checkpointing_disable")
        if hasattr(tiny, "activation_checkpointing_enable")
        else ("gradient_checkpointing_enable", "gradient_checkpointing_disable")
    )
    getattr(tiny, enable)()
    try:
        assert choose_layout(tiny) == "padded" and choose_layout(tiny, "prefix") == "padded"
    finally:
        getattr(tiny, disable)()
    assert choose_layout(tiny) == "prefix"
    saved = tiny.config._attn_implementation
    try:
        for impl, want in [
            ("flash_attention_2", "packed"),
            ("flex_attention", "packed"),
            ("kernels-community/flash-attn3", "packed"),
            ("eager", "prefix"),
        ]:
            tiny.config._attn_implementation = impl
            assert choose_layout(tiny) == want, impl
            assert choose_layout(NoCache(tiny)) == ("packed" if want == "packed" else "padded"), impl
    finally:
        tiny.config._attn_implementation = saved
    with pytest.raises(ValueError, match="layout must be"):
        choose_layout(tiny, "ragged")


def _forward_rows(models, batch, layout) -> list[tuple[int, list[int], list[int]]]:
    """(policy, input ids, position ids) of every row of every forward ``packed_logprobs`` runs."""
    seen = []
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, a, kw, i=i: seen.append((i, kw["input_ids"], kw["position_ids"])), with_kwargs=True
        )
        for i, m in enumerate(models)
    ]
    try:
        with torch.no_grad():
            packed_logprobs(models, batch, layout=layout, bucket_overhead=10**9)
    finally:
        for h in hooks:
            h.remove()
    return [(i, r.tolist(), q.tolist()) for i, x, pos in seen for r, q in zip(x, pos)]


@pytest.mark.parametrize("sharing", ["small", "real"])
def test_prefix_layout_runs_each_shared_segment_once(models, batch, sharing, monkeypatch):
    """The prefix layout's forwards hold fewer token cells than the padded layout's wherever inputs
    share enough, and run one row per segment of each policy's prefix tree, each segment's tokens
    at its positions; a policy whose tree would run more than ``MAX_TREE_SHARE`` of its tokens gets
    the padded layout's rows."""
    import srpo_graph.srpo.prefix_tree as tree_mod
    from srpo_graph.srpo.prefix_tree import prefix_tree

    if sharing == "real":
        _real_sharing(monkeypatch)

    cells = {layout: sum(len(r) for _, r, _ in _forward_rows(models, batch, layout)) for layout in ("padded", "prefix")}
    rows = _forward_rows(models, batch, "prefix")
    padded_rows = _forward_rows(models, batch, "padded")
    trees = {}
    for pol in (0, 1):
        members = (batch.member_policy == pol).nonzero().squeeze(1)
        tree = prefix_tree(batch, members)
        if tree.num_tokens > tree_mod.MAX_TREE_SHARE * int(
            (batch.member_offsets[1:] - batch.member_offsets[:-1])[members].sum()
        ):
            # too little shared: the padded way, row for row
            assert [r for r in rows if r[0] == pol] == [r for r in padded_rows if r[0] == pol], pol
        else:
            trees[pol] = tree
    if not trees:
        assert cells["prefix"] == cells["padded"]
        return
    lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
    if sum(t.num_tokens for t in trees.values()) <= 0.75 * int(lengths[batch.member_policy < 2].sum()):
        assert cells["prefix"] < cells["padded"]  # with padding: levels pad too, so only where sharing is real
    for pol, tree in trees.items():
        assert sum(i == pol for i, _, _ in rows) == len(tree.start), pol  # one row per segment
        for g, (a, z) in enumerate(zip(tree.start, tree.end)):
            s = int(batch.member_offsets[tree.rep[g]])
            seg = batch.input_ids[s + a : s + z].tolist()
            assert any(i == pol and r[: z - a] == seg and q[0] == a for i, r, q in rows), (pol, g)


def _brute_force_cost(lengths: list[int], overhead: int) -> int:
    """The cheapest split of the sorted lengths into contiguous buckets, by enumeration."""
    xs = sorted(lengths)
    best = None
    for cuts in itertools.product([False, True], repeat=len(xs) - 1):
        cost, start = 0, 0
        for i, cut in enumerate(list(cuts) + [True]):
            if cut:
                cost += (i + 1 - start) * xs[i] + overhead
                start = i + 1
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_length_buckets_is_the_optimum_and_a_partition(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 10))]
    overhead = rng.choice([0, 5, 30, 1000])
    buckets = length_buckets(lengths, overhead)
    assert sorted(i for bk in buckets for i in bk) == list(range(len(lengths)))
    flat = [lengths[i] for bk in buckets for i in bk]
    assert flat == sorted(flat)
    cost = sum(len(bk) * max(lengths[i] for i in bk) + overhead for bk in buckets)
    assert cost == _brute_force_cost(lengths, overhead)


def _batch_of_prompts(prompts: list[list[int]]):
    """A one-policy SetBatch whose members have these prompts and a 2-token completion each."""
    from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, WorkflowRef

    outputs = [
        Output(
            id=f"o{i}",
            agent="a",
            policy="p",
            policy_version=0,
            step=i,
            prompt_ids=p,
            completion_ids=[1, 2],
            logprobs=[-1.0, -1.0],
            temperature=1.0,
            allowed_token_ids=None,
            max_tokens=2,
            activated_by=None,
            text="",
            value=None,
        )
        for i, p in enumerate(prompts)
    ]
    transitions = [
        TransitionRecord(id=f"t{i}", name=f"t{i}", step=i, consumed=[f"o{i}"], activated=["end"], reward=None)
        for i in range(len(prompts))
    ]
    ep = Episode(
        workflow=WorkflowRef(name="x", hash="0" * 64),
        task_id="t",
        group_id="t",
        sample=0,
        seed=0,
        outputs=outputs,
        transitions=transitions,
        reward=1.0,
        status="ok",
    )
    return compile([ep], CompileConfig())


def _trie_tokens(seqs: list[list[int]]) -> int:
    """Distinct non-empty prefixes of ``seqs`` (the nodes of their trie), counted one by one."""
    return len({tuple(x[:k]) for x in seqs for k in range(1, len(x) + 1)})


@pytest.mark.parametrize("seed", range(16))
def test_prefix_tree_covers_each_needed_position_once(seed):
    """Random nested prompts (chat-like chains: a prompt extends another member's whole sequence,
    samples that share a prompt, exact duplicates, ids above 255): every member's path covers its
    input positions 0 .. len - 2 once, in order, and each segment's tokens are that member's; the
    tokens run never exceed padded's and, with ``min_saved`` 0, are the trie's of the inputs; every
    node has two or more things under it and saves ``min_saved`` or more."""
    from srpo_graph.srpo.prefix_tree import prefix_tree

    rng = random.Random(seed)
    alphabet = (1, 2, 300, 70_000)  # ids above 255: the order follows the ids, not their low bytes
    word = lambda k: [rng.choice(alphabet) for _ in range(k)]  # noqa: E731
    prompts: list[list[int]] = []
    for _ in range(rng.randint(1, 4)):  # a task: G samples of a chat, a few turns each
        first = word(rng.randint(1, 10))
        for _ in range(rng.randint(1, 3)):
            prompt = list(first)
            for _ in range(rng.randint(1, 3)):
                prompts.append(list(prompt))
                prompt = prompt + [1, 2] + word(rng.randint(0, 4))  # + the turn's completion (below) + a message
    b = _batch_of_prompts(prompts)
    seqs = [b.input_ids[int(b.member_offsets[m]) : int(b.member_offsets[m + 1])].tolist() for m in range(b.num_members)]
    for min_saved in (0, 1, 4, 8):
        tree = prefix_tree(b, torch.arange(b.num_members), min_saved)
        assert sorted(tree.last) == list(range(b.num_members))
        for m, seq in enumerate(seqs):
            at = 0
            for g in tree.path(m):
                assert tree.start[g] == at < tree.end[g]
                s = int(b.member_offsets[tree.rep[g]])
                assert b.input_ids[s + tree.start[g] : s + tree.end[g]].tolist() == seq[tree.start[g] : tree.end[g]]
                at = tree.end[g]
            assert at == len(seq) - 1
        assert tree.num_tokens <= sum(len(x) - 1 for x in seqs)
        for g in range(len(tree.start)):
            under = len(tree.children[g]) + sum(tree.last[m] == g for m in tree.last)
            if under > 1 or tree.children[g]:
                assert under >= 2 and (under - 1) * (tree.end[g] - tree.start[g]) >= min_saved
        if min_saved == 0:
            assert tree.num_tokens == _trie_tokens([x[:-1] for x in seqs])
        if min_saved == 8:  # more nodes cannot cost more tokens
            assert tree.num_tokens >= prefix_tree(b, torch.arange(b.num_members), 0).num_tokens


def test_prefix_layout_falls_back_to_padded_where_a_cache_cannot_be_repeated(models, batch, monkeypatch):
    """A cache the prefix layout cannot repeat (a legacy or non-key/value cache): the bucket's members
    take the padded path, with the same log-probs."""
    import srpo_graph.srpo.prefix_tree as tree_mod

    with torch.no_grad():
        want, _ = packed_logprobs(models, batch, layout="padded")
        monkeypatch.setattr(tree_mod, "_can_repeat", lambda cache: False)
        got, _ = packed_logprobs(models, batch, layout="prefix")
    assert torch.allclose(got, want, atol=1e-6)


def _chat_batch(vocab: int, seed: int = 0):
    """Chat-shaped episodes of two policies: 3 tasks x 3 samples, each a chain of 3 turns on ``tiny``
    whose turn k prompt is turn k-1's prompt + completion + a new message, plus a ``small`` judge
    whose prompt is turn 2's whole sequence (the same tokens, another policy: nothing shared across).
    Sample 0's first turn is one token right after the task's prompt (the branch point); samples 1
    and 2 of task 0 sample the same first turn (equal inputs); turn 2 is constrained, turn 3 at
    temperature 0.7, the judge at 1.3."""
    from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, WorkflowRef

    rng = random.Random(seed)
    words = lambda k: [rng.randrange(3, vocab) for _ in range(k)]  # noqa: E731
    eps = []
    for task in range(3):
        first, same = words(rng.randint(6, 16)), words(4)
        for g in range(3):
            outputs, prompt = [], list(first)
            for turn in range(3):
                said = (
                    words(1) if turn == 0 and g == 0 else same if turn == 0 and task == 0 else words(rng.randint(2, 6))
                )
                allowed = sorted(set(said + words(5))) if turn == 1 else None
                outputs.append(
                    Output(
                        id=f"o{turn}",
                        agent="chat",
                        policy="tiny",
                        step=turn,
                        prompt_ids=prompt,
                        completion_ids=said,
                        logprobs=[-1.0] * len(said),
                        temperature=0.7 if turn == 2 else 1.0,
                        allowed_token_ids=allowed,
                        max_tokens=8,
                        text="",
                    )
                )
                if turn == 1:
                    outputs.append(
                        Output(
                            id="judge",
                            agent="judge",
                            policy="small",
                            step=3,
                            prompt_ids=prompt + said,
                            completion_ids=words(2),
                            logprobs=[-1.0, -1.0],
                            temperature=1.3,
                            max_tokens=2,
                            text="",
                        )
                    )
                prompt = prompt + said + words(rng.randint(1, 5))
            transitions = [
                TransitionRecord(id=f"t{k}", name=f"t{k}", step=k, consumed=[o.id], activated=["end"], reward=None)
                for k, o in enumerate(outputs)
            ]
            eps.append(
                Episode(
                    workflow=WorkflowRef(name="x", hash="0" * 64),
                    task_id=f"task{task}",
                    group_id=f"task{task}",
                    sample=g,
                    seed=0,
                    outputs=outputs,
                    transitions=transitions,
                    reward=float(g),
                    status="ok",
                )
            )
    return compile(eps, CompileConfig())


def _logprobs_and_grads(models, b, layout, overhead=0):
    """The log-probs of ``b`` in ``layout`` (the one-member reference for None) and the gradients of a
    fixed random weighting of them."""
    _zero(models)
    if layout is None:
        lp, _ = reference_logprobs(models, b)
    else:
        lp, _ = packed_logprobs(models, b, layout=layout, bucket_overhead=overhead)
    w = torch.randn(b.num_tokens, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * b.loss_mask
    (lp.double() * w).sum().backward()
    grads = _grads(models)
    _zero(models)
    return lp.detach().double(), grads


def _assert_layouts_agree(models, b):
    want_lp, want_grads = _logprobs_and_grads(models, b, None)
    assert any(g.abs().sum() > 0 for g in want_grads)
    mask = b.loss_mask
    for layout, overhead in [("padded", 128), ("prefix", 0), ("prefix", 128), ("prefix", 10**9)]:
        lp, grads = _logprobs_and_grads(models, b, layout, overhead)
        assert torch.allclose(lp[mask], want_lp[mask], atol=2e-6), (layout, overhead)
        assert torch.all(lp[~mask] == 0)
        for got, want in zip(grads, want_grads):
            assert torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-4), (layout, overhead)


def test_prefix_layout_on_nested_chat_turns(models):
    """Chat turns nest: the tree has a node per task, per sample's first turn and per second turn, a
    first turn's input ends at a node (scored from the later turns' rows), the judge's policy gets its
    own tree; log-probs and gradients equal the padded layout's and the one-member reference's."""
    from srpo_graph.srpo.prefix_tree import prefix_tree

    b = _chat_batch(models[0].config.vocab_size)
    tiny = prefix_tree(b, (b.member_policy == 0).nonzero().squeeze(1), min_saved=0)
    judge = (b.member_policy == 1).nonzero().squeeze(1)
    assert max(len(tiny.path(m)) for m in tiny.last) >= 4  # task prompt, first turn, second turn, tail
    assert sum(tiny.children[tiny.last[m]] != [] for m in tiny.last) >= 9  # inputs that end where a later turn goes on
    assert judge.numel() == 9 and not set(tiny.last) & set(judge.tolist())
    seqs = [
        b.input_ids[int(b.member_offsets[m]) : int(b.member_offsets[m + 1]) - 1].tolist() for m in sorted(tiny.last)
    ]
    assert tiny.num_tokens == _trie_tokens(seqs) < sum(map(len, seqs)) / 2
    _assert_layouts_agree(models, b)


@pytest.fixture(scope="module")
def chat_rollout(tmp_path_factory):
    """One rollout of workflows/chat_search_qwen3.wf (3 tasks x G = 3) on the qwen3-test model, and the model."""
    from pathlib import Path

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.lang import load_workflow
    from srpo_graph.models.architectures import ensure_local_model
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    root = Path(__file__).resolve().parents[2]
    backend = TransformersBackend.from_pretrained(str(ensure_local_model("qwen3-test", tmp_path_factory.mktemp("q3"))))
    wf = load_workflow(root / "workflows" / "chat_search_qwen3.wf")
    tasks = load_tasks(root / "workflows" / "tasks" / "chat_search_qwen3.jsonl", wf)[:3]
    episodes = run(wf, tasks, {"m": backend}, samples=3, seed=3).episodes
    return compile(episodes, CompileConfig(micro_batch_tokens=0)), backend.model


def test_prefix_layout_on_the_chat_workflow(chat_rollout, monkeypatch):
    """The real chat agent (qwen3-test, its chat template, tool messages between turns): the tree shares
    each task's prompt and each sample's earlier turns, and the prefix layout's log-probs and gradients
    equal the padded layout's and the one-member reference's."""
    from srpo_graph.srpo.prefix_tree import prefix_tree

    _real_sharing(monkeypatch)
    b, model = chat_rollout
    model.eval()
    tree = prefix_tree(b, torch.arange(b.num_members))
    off = b.member_offsets.tolist()
    padded = sum(off[m + 1] - off[m] for m in range(b.num_members))
    assert b.num_members > 9 and tree.num_tokens < padded / 2
    assert any(tree.children[tree.last[m]] for m in tree.last)  # an earlier turn scored from its later turn's rows
    _assert_layouts_agree([model], b)
