"""The chat agents' id-level proofs rerun on the released Qwen3 vocabulary (issue 37.4).

``qwen3-realvocab-test`` (srpo_graph/models/released.py) has Qwen3's exact tokenizer -- the released
BPE ranks, 151,669 tokens, ``<think>``/``</think>`` at 151667/151668 -- at the test width, so the rules
of runtime/chat.py (Note [Token in, token out], Note [Think by text]), of stop strings
(``prompts.trim_at_stop``) and of the prefix tree (srpo/prefix_tree.py) meet the pieces users'
models have: ``" answer"`` one token that the stop string ``"ans"`` ends inside, ``</think>`` also
writable as ``</`` ``think`` ``>``, ``>\\n\\n`` one token the think cut falls inside, characters whose
UTF-8 bytes are split over tokens. The proofs are test_chat_agents.py's, run on this model.
"""

from __future__ import annotations

import random

import pytest
import torch

from srpo_graph.backends.transformers import TransformersBackend
from tests.runtime import test_chat_agents as base


@pytest.fixture(scope="module")
def qwen3_real(realvocab):
    torch.set_num_threads(1)
    path = realvocab("qwen3-realvocab-test")
    return path, TransformersBackend.from_pretrained(str(path))


@pytest.mark.parametrize("think", ["keep", "strip"])
def test_every_trained_id_is_a_sampled_id_on_the_real_vocabulary(qwen3_real, think):
    """test_chat_agents' proof, unchanged, on Qwen3's vocabulary: the trace holds what was sent and
    sampled, turn k's prompt is the plain reference loop's over the hand-written Qwen3 template,
    ``"ans"`` stops inside the real piece `` answer``, the batch trains exactly the sampled ids and the
    trainer's forward gives the sampler's log-probs."""
    tok = qwen3_real[1].tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<|im_end|>")] == [151667, 151668, 151645]
    assert len(tok(" answer", add_special_tokens=False)["input_ids"]) == 1
    base.test_every_trained_id_is_an_id_the_sampler_produced_and_saw(qwen3_real, think)


def test_think_strip_cuts_by_text_on_the_real_pieces(qwen3_real):
    """``</think>`` as its token (151668) or as Qwen's BPE pieces, and ``>\\n\\n`` -- one real token
    that the cut falls inside -- with words and newlines around: the kept ids decode to Qwen3's own
    cut of the text and are exactly the sampled ids' tail."""
    tok = qwen3_real[1].tokenizer

    def enc(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    inside = enc(">\n\n")
    assert len(inside) == 1 and len(enc("</think>\n\n")) == 2  # the close token, then one `\n\n` token
    pieces = [[151668], enc("</"), enc("think"), enc(">"), inside, enc("\n"), enc("\n\n"), enc("The"),
              enc(" answer"), [151667]]
    assert enc("</") + enc("think") + inside != enc("</think>\n\n")  # the pieces are not what encoding gives
    rng = random.Random(0)
    by_pieces = cut_inside = 0
    for _ in range(400):
        ids = [i for _ in range(rng.randint(1, 14)) for i in rng.choice(pieces)]
        if rng.random() < 0.5:
            at = rng.randint(0, len(ids))
            ids[at:at] = enc("</") + enc("think") + rng.choice([enc(">"), inside])
        got = base._check_strip(tok, ids)
        text = tok.decode(ids)
        by_pieces += "</think>" in text and 151668 not in ids and got != tuple(ids)
        # on Qwen's vocabulary no token runs from `>` into a word (its split regex ends a
        # punctuation piece at the newlines), so the cut never leaves part of a token: every kept
        # id is a sampled one, the suffix of the turn
        assert got == tuple(ids[len(ids) - len(got) :]), (ids, got)
        cut_inside += "</think>" in text and inside[0] in ids and got != tuple(ids)
    assert by_pieces > 50 and cut_inside > 50


def test_stop_strings_and_multibyte_characters_split_across_tokens(qwen3_real):
    """Characters whose UTF-8 bytes Qwen's BPE splits over two or more tokens: a stop string made of
    one is found only once its last byte is sampled, and the cut keeps exactly the tokens up to it;
    partial bytes decode to U+FFFD and are kept as sampled ids, never re-encoded."""
    from srpo_graph.backends.base import Completion
    from srpo_graph.lang import check, parse
    from srpo_graph.runtime.prompts import plan_agents, trim_at_stop

    path, backend = qwen3_real
    tok = backend.tokenizer

    def enc(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    split = [c for c in "龘𝄞𓀀鱻齉🦩" if len(enc(c)) >= 2 and all("\ufffd" in tok.decode([i]) for i in enc(c))]
    assert len(split) >= 2, [(c, enc(c)) for c in "龘𝄞𓀀鱻齉🦩"]
    stop = split[0]
    wf = check(parse(f'workflow w\npolicy m = "{path}"\nagent a {{\n  policy: m\n  prompt: "x"\n'
                     f'  sample {{ max_tokens: 30, stop: ["{stop}"] }}\n}}\n'
                     "transition t { consume: a activate: end }\nstart: a\n"))
    plan = plan_agents(wf, {"m": backend})["a"]
    head = enc(" the ") + enc(split[1]) + enc(" then ")
    ids = head + enc(stop) + enc(" more")
    for k in range(1, len(enc(stop))):  # a stop character cut mid-bytes is not there yet
        partial = Completion(completion_ids=tuple(head + enc(stop)[:k]), logprobs=(0.0,) * (len(head) + k),
                             finish_reason="length")
        kept, _, finish, text = trim_at_stop(plan, partial)
        assert kept == partial.completion_ids and finish == "length" and text.endswith("\ufffd")
    comp = Completion(completion_ids=tuple(ids), logprobs=tuple(-0.1 * i for i in range(len(ids))),
                      finish_reason="length")
    kept, lps, finish, text = trim_at_stop(plan, comp)
    assert kept == tuple(head + enc(stop)) and finish == "stop" and text.endswith(stop)
    assert lps == comp.logprobs[: len(kept)] and text.count("\ufffd") == 0


def test_partial_utf8_turns_go_on_as_sampled_ids(qwen3_real, tmp_path):
    """Unconstrained turns on the untrained model sample byte pieces of characters (Qwen's vocabulary
    has them): the next turn's prompt goes on with exactly those ids, though their text
    (with U+FFFD) would encode to other ids."""
    from srpo_graph.lang import check, parse
    from srpo_graph.runtime.executor import run

    path, backend = qwen3_real
    tok = backend.tokenizer
    wf = check(parse(base.WF.format(model=path, system=base.SYSTEM, think="keep").replace(
        ', stop: ["ans"],\n           allow: ["<think>", "</think>", "\\n", " no", " answer", ".", ":", " '
        'search", "<|im_end|>"]', "")))
    episodes = run(wf, base.TASKS, {"m": backend}, samples=4, seed=7).episodes
    not_reencodable = 0
    for ep in episodes:
        assert ep.status != "failed", ep.error
        talker = [o for o in ep.outputs if o.agent == "talker"]
        for before, after in zip(talker, talker[1:]):
            history = before.prompt_ids + before.completion_ids
            assert after.prompt_ids[: len(history)] == history
            text = tok.decode(before.completion_ids)
            not_reencodable += tok(text, add_special_tokens=False)["input_ids"] != before.completion_ids
    assert not_reencodable > 0


def test_chat_prefix_tree_counts_on_the_real_vocabulary(qwen3_real):
    """workflows/chat_search_qwen3.wf on the real vocabulary: the tree runs each shared prompt and
    earlier turn once (its token count is the trie's of the members' inputs, counted independently,
    under half the padded count) and the prefix layout's log-probs equal the padded layout's."""
    from pathlib import Path

    from srpo_graph.compiler.compile import compile as compile_batch
    from srpo_graph.compiler.options import CompileConfig
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.srpo.logprobs import packed_logprobs
    from srpo_graph.srpo.prefix_tree import prefix_tree

    path, backend = qwen3_real
    root = Path(__file__).resolve().parents[2]
    wf = load_workflow(root / "workflows" / "chat_search_qwen3.wf")
    tasks = load_tasks(root / "workflows" / "tasks" / "chat_search_qwen3.jsonl", wf)[:3]
    b = compile_batch(run(wf, tasks, {"m": backend}, samples=3, seed=3).episodes, CompileConfig(micro_batch_tokens=0))
    tree = prefix_tree(b, torch.arange(b.num_members), min_saved=0)
    off = b.member_offsets.tolist()
    inputs = [b.input_ids[off[m] : off[m + 1] - 1].tolist() for m in range(b.num_members)]
    trie = len({tuple(x[:k]) for x in inputs for k in range(1, len(x) + 1)})
    assert max(max(x) for x in inputs) > 150_000  # the real vocabulary's ids (<|im_start|> & co.)
    assert tree.num_tokens == trie < sum(map(len, inputs)) / 2
    model = backend.model
    model.eval()
    with torch.no_grad():
        lp_prefix, _ = packed_logprobs([model], b, layout="prefix", bucket_overhead=0)
        lp_padded, _ = packed_logprobs([model], b, layout="padded")
    mask = b.loss_mask.bool()
    assert torch.allclose(lp_prefix[mask], lp_padded[mask], atol=1e-5)
