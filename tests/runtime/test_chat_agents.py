"""Chat agents, token in and token out (issue 21; runtime/chat.py, Note [Token in, token out]).

Real components only: the Qwen3-shaped ``qwen3-test`` model with its byte-level BPE tokenizer and
Qwen3 chat template (built here in seconds), the transformers backend sampling it, the real
retriever tool, the compiler and the trainer's log-prob forward. The backend is wrapped to record
what it was asked and what it returned (a recorder, not a double: every call goes through).

The talker's sampling is constrained (``allow``) to a few tokens -- ``<think>``, ``</think>``,
newlines, words, ``<|im_end|>`` -- so the untrained model's turns hold think blocks, end at the
end-of-turn token, run to ``max_tokens`` and hit the stop string ``"ans"``, which only ever falls
inside the BPE token `` answer``: every case the turn-to-turn rule has.
"""

from __future__ import annotations

import pytest
import torch

from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.compiler.options import CompileConfig
from srpo_graph.lang import check, parse
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.prompts import single_token_id
from srpo_graph.runtime.tasks import Task
from srpo_graph.srpo.logprobs import packed_logprobs

SYSTEM = "Think, then answer."
WF = """workflow chat_proof
import std
task {{ question: text  answer: text  go: choice[more, done] }}
policy m = "{model}"
agent talker {{
  policy: m
  system: "{system}"
  memory: chat
  think: {think}
  prompt: "Q: {{task.question}}"
  sample {{ temperature: 1.0, max_tokens: 10, stop: ["ans"],
           allow: ["<think>", "</think>", "\\n", " no", " answer", ".", ":", " search", "<|im_end|>"] }}
  output: text
}}
agent critic {{
  policy: m
  prompt: "Judge: {{talker}}"
  sample {{ max_tokens: 4 }}
  output: text
}}
transition said {{
  consume: talker
  tool passage = std.retrieve(talker, k=1)
  activate: critic
  max_rounds: 3
}}
transition heard {{
  consume: critic
  activate: route task.go {{ more -> talker, done -> end }}
  max_rounds: 2
}}
start: talker
reward: std.f1(talker, task.answer)
max_steps: 6
"""
TASKS = [Task(id="q0", fields={"question": "in which year was loda founded?", "answer": "1131", "go": "more"}),
         Task(id="q1", fields={"question": "who founded loda?", "answer": "lonomor", "go": "more"})]


class Recorder:
    """The real backend, with every request and raw completion it saw kept in order."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []
        self.tokenizer = backend.tokenizer

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate(self, requests):
        out = self.backend.generate(requests)
        self.calls += list(zip(requests, out))
        return out


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from srpo_graph.models.architectures import ensure_local_model

    torch.set_num_threads(1)
    path = ensure_local_model("qwen3-test", tmp_path_factory.mktemp("m") / "qwen3-test")
    return path, TransformersBackend.from_pretrained(str(path))


def _reference_prompts(tok, ep, think: str) -> dict[str, list[int]]:
    """Each talker turn's prompt ids by a plain loop over the episode, with Qwen3's template
    written out by hand: turn 1 encodes the system and user messages, turn k appends turn k-1's
    sampled ids (under ``strip`` without the think block and the newlines after it), the end of
    turn where sampling did not produce it, the retriever's passage as a tool response and the
    critic's words as a user message."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    close, eot = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("<|im_end|>")
    out, prev = {}, None
    for o in ep.outputs:
        if o.agent != "talker":
            continue
        if prev is None:
            ids = enc(
                f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nQ: "
                f"{TASKS[int(ep.task_id[1])].fields['question']}"
                "<|im_end|>\n<|im_start|>assistant\n"
            )
        else:
            said = list(prev.completion_ids)
            if think == "strip" and close in said:
                said = said[len(said) - said[::-1].index(close) :]
                while said and set(tok.decode([said[0]])) == {"\n"}:
                    said = said[1:]
            fired = [r for r in ep.transitions[prev.step :] if prev.id in r.consumed or r.id == o.activated_by]
            tail = "" if said and said[-1] == eot else "<|im_end|>"
            for r in fired:
                for oid in r.consumed:
                    other = ep.outputs[int(oid[1:])]
                    if other.agent != "talker":
                        text = other.text.split("</think>")[-1].lstrip("\n") if "</think>" in other.text else other.text
                        tail += f"\n<|im_start|>user\n{text}<|im_end|>"
                if r.tool_results:
                    tail += (
                        f"\n<|im_start|>user\n<tool_response>\n{r.tool_results['passage']}\n</tool_response><|im_end|>"
                    )
            ids = out[prev.id] + said + enc(tail + "\n<|im_start|>assistant\n")
        out[o.id] = ids
        prev = o
    return out


@pytest.mark.parametrize("think", ["keep", "strip"])
def test_every_trained_id_is_an_id_the_sampler_produced_and_saw(qwen3, think):
    path, backend = qwen3
    tok = backend.tokenizer
    wf = check(parse(WF.format(model=path, system=SYSTEM, think=think)))
    rec = Recorder(backend)
    episodes = run(wf, TASKS, {"m": rec}, samples=3, seed=3).episodes
    raw = {req.request_id: (req, comp) for req, comp in rec.calls}
    close, eot = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("<|im_end|>")
    cut_in_token = single_token_id(tok, " answer")
    seen = {"turns>1": 0, "think_in_earlier_turn": 0, "eot": 0, "length": 0, "stop_inside_token": 0}
    for ep in episodes:
        assert ep.status != "failed", ep.error
        reference = _reference_prompts(tok, ep, think)
        talker = [o for o in ep.outputs if o.agent == "talker"]
        for k, o in enumerate(talker):
            req, comp = raw[f"{ep.group_id}/{ep.sample}/{o.id}"]
            # the trace holds what was sent and what came back: the kept ids are a prefix of the sampled ones
            assert o.prompt_ids == list(req.prompt_ids) == reference[o.id]
            assert o.completion_ids == list(comp.completion_ids[: len(o.completion_ids)])
            assert o.logprobs == list(comp.logprobs[: len(o.logprobs)])
            if len(o.completion_ids) < len(comp.completion_ids) or (
                o.completion_ids and o.completion_ids[-1] == cut_in_token
            ):
                # the stop string "ans" ends inside ` answer`: cut after that token, the rest dropped
                assert o.completion_ids[-1] == cut_in_token and o.finish_reason == "stop"
                assert o.text.endswith(" answer") and o.text.count("ans") == 1
                seen["stop_inside_token"] += 1
            seen["eot"] += bool(o.completion_ids and o.completion_ids[-1] == eot)
            seen["length"] += o.finish_reason == "length"
            if k:
                seen["turns>1"] += 1
                before = talker[k - 1]
                history = before.prompt_ids + before.completion_ids
                if close in before.completion_ids:
                    seen["think_in_earlier_turn"] += 1
                # keep: the earlier turn goes on exactly as sampled; strip: its think block is gone
                assert (o.prompt_ids[: len(history)] == history) == (
                    think == "keep" or close not in before.completion_ids
                )
                assert o.prompt_ids[: len(before.prompt_ids)] == before.prompt_ids
    assert all(seen.values()), seen
    # the compiled batch trains exactly these ids, each turn given its own prompt
    batch = compile_batch(episodes, CompileConfig(micro_batch_tokens=0))
    outputs = {(f"{ep.group_id}/{ep.sample}", o.id): o for ep in episodes for o in ep.outputs}
    off = batch.member_offsets.tolist()
    by_member = []
    for m, oid in enumerate(batch.member_ids):
        o = outputs[(batch.episode_ids[int(batch.set_episode[int(batch.member_set[m])])], oid)]
        ids = batch.input_ids[off[m] : off[m + 1]].tolist()
        mask = batch.loss_mask[off[m] : off[m + 1]].bool()
        assert ids == o.prompt_ids + o.completion_ids
        assert batch.input_ids[off[m] : off[m + 1]][mask].tolist() == o.completion_ids
        assert torch.equal(batch.sampler_logprobs[off[m] : off[m + 1]][mask], torch.tensor(o.logprobs))
        by_member.append(o)
    assert {o.id for o in by_member if o.agent == "talker"}
    # and the trainer's forward over those ids gives the sampler's log-probs (same weights)
    lp, _ = packed_logprobs([backend.model], batch, layout="prefix")
    done = batch.loss_mask.bool()
    assert torch.allclose(lp[done], batch.sampler_logprobs[done], atol=1e-4), (
        (lp[done] - batch.sampler_logprobs[done]).abs().max()
    )


# a template that writes the number of messages first: every new message re-renders the start
COUNTING = (
    "{{ messages|length }} messages\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rewrites_earlier_turns_fails_the_episode_clearly(qwen3):
    from transformers import AutoTokenizer

    path, backend = qwen3
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.chat_template = COUNTING
    wf = check(parse(WF.format(model=path, system=SYSTEM, think="keep")))
    result = run(wf, TASKS[:1], {"m": TransformersBackend(backend.model, tok)}, samples=1, seed=0)
    ep = result.episodes[0]
    assert ep.status == "failed" and result.stats.failed_by_kind == {"prompt": 1}
    assert "prefix property fails at character 0: '2 messages" in ep.error and ep.error.startswith("<string>:")
    assert [o.agent for o in ep.outputs] == ["talker", "critic"]  # turn 1 ran; turn 2 was refused


def test_a_chat_agent_on_a_tokenizer_without_a_chat_template_is_refused_at_start(tiny_backend):
    """A hub name the checker cannot look at, run on the tiny model (no chat template)."""
    from srpo_graph.errors import RuntimeFailure

    wf = check(
        parse(
            WF.format(model="some-org/not-here", system=SYSTEM, think="keep").replace(
                ', stop: ["ans"],\n           allow: ["<think>", "</think>", "\\n", " no", " answer", ".", ":", " '
                'search", '
                '"<|im_end|>"]',
                "",
            )
        )
    )
    with pytest.raises(
        RuntimeFailure,
        match=r"<string>:5:1: error: chat agent 'talker': the tokenizer of policy "
        r"'m' has no chat template",
    ):
        run(wf, TASKS[:1], {"m": tiny_backend}, samples=1)


def test_show_renders_a_chat_agents_conversation_with_its_roles(qwen3):
    from rich.console import Console

    from srpo_graph.runtime.show import PromptDecoder, conversation, print_episode

    path, backend = qwen3
    wf = check(parse(WF.format(model=path, system=SYSTEM, think="strip")))
    ep = run(wf, TASKS[:1], {"m": backend}, samples=1, seed=1).episodes[0]
    decode = PromptDecoder({"m": str(path)})
    turns = [o for o in ep.outputs if o.agent == "talker"]
    roles = [role for role, _ in conversation(decode(turns[1]))]
    assert roles == ["system", "user", "assistant", "user", "user", "assistant"]  # tool response, critic, open turn
    console = Console(record=True, width=200)
    print_episode(console, ep, decode=decode)
    shown = console.export_text()
    assert "   system │ Think, then answer." in shown and "     user │ <tool_response>" in shown


def test_llama3_turns_extend_the_sampled_ids_with_its_own_headers(tmp_path):
    """The same rule through Llama 3's template: the tool result in its `ipython` role, content
    trimmed by the template, `<|eot_id|>` ending a turn, `<|begin_of_text|>` only once."""
    from srpo_graph.models.architectures import ensure_local_model

    path = ensure_local_model("llama3-test", tmp_path / "llama3-test")
    backend = TransformersBackend.from_pretrained(str(path))
    tok = backend.tokenizer
    wf = check(
        parse(
            WF.format(model=path, system=SYSTEM, think="keep").replace(
                ', stop: ["ans"],\n           allow: ["<think>", "</think>", "\\n", " no", " answer", ".", ":", " '
                'search", '
                '"<|im_end|>"]',
                "",
            )
        )
    )
    ep = run(wf, TASKS[:1], {"m": backend}, samples=1, seed=2).episodes[0]
    assert ep.status != "failed", ep.error
    t1, t2 = [o for o in ep.outputs if o.agent == "talker"][:2]
    critic = next(o for o in ep.outputs if o.agent == "critic")
    passage = ep.transitions[0].tool_results["passage"]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    end = "" if t1.completion_ids[-1] == eot else "<|eot_id|>"
    delta = (
        f"{end}<|start_header_id|>ipython<|end_header_id|>\n\n{passage.strip()}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{critic.text.strip()}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert t2.prompt_ids == t1.prompt_ids + t1.completion_ids + tok(delta, add_special_tokens=False)["input_ids"]
    assert t2.prompt_ids.count(tok.convert_tokens_to_ids("<|begin_of_text|>")) == 1


def test_check_reports_a_chat_agent_on_the_tiny_model(tiny_backend):
    """`srpo-graph check`'s token rule (runtime/tokens.py) sees the tiny tokenizer even before tiny is built."""
    from srpo_graph.runtime.tokens import token_diagnostics

    wf = check(
        parse(
            'workflow w\nimport std\npolicy p = "some-org/not-here"\nagent a {\n  policy: p\n  memory: chat\n'
            '  prompt: "x"\n}\ntransition t { consume: a activate: end }\nstart: a\n'
        )
    )
    diags = token_diagnostics(wf, {"p": tiny_backend.tokenizer})
    assert [(d.code, d.span.line) for d in diags] == [("no-chat-template", 4)]


TWO_CALLERS = """workflow two_callers
import std
task {{ question: text  answer: text  go: choice[more, done] }}
policy m = "{model}"
agent lead {{
  policy: m
  memory: chat
  prompt: "Q: {{task.question}}"
  sample {{ temperature: 1.0, max_tokens: 3 }}
  output: text
}}
agent a {{
  policy: m
  prompt: "A says about {{lead}}"
  sample {{ temperature: 1.0, max_tokens: 3 }}
  output: text
}}
agent b {{
  policy: m
  prompt: "B says about {{lead}}"
  sample {{ temperature: 1.0, max_tokens: 3 }}
  output: text
}}
transition asked {{
  consume: lead
  activate: route task.go {{ more -> a, b, done -> end }}
  max_rounds: 2
}}
transition from_a {{
  consume: a
  activate: lead
}}
transition from_b {{
  consume: b
  activate: lead
}}
start: lead
max_steps: 4
"""


def test_a_chat_turn_activated_twice_hears_both_firings(qwen3):
    """Two firings in one round activate the pending chat agent: its next turn carries the
    messages of both (the second activation used to be dropped, only the first one's kept)."""
    path, backend = qwen3
    tok = backend.tokenizer
    wf = check(parse(TWO_CALLERS.format(model=path)))
    ep = run(wf, TASKS[:1], {"m": backend}, samples=1, seed=4).episodes[0]
    assert ep.status != "failed", ep.error
    assert [r.name for r in ep.transitions[:3]] == ["asked", "from_a", "from_b"]
    t1, t2 = [o for o in ep.outputs if o.agent == "lead"][:2]
    said_a, said_b = (next(o for o in ep.outputs if o.agent == x) for x in ("a", "b"))
    assert t2.activated_by == ep.transitions[1].id  # provenance keeps the first firing
    end = "" if t1.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") else "<|im_end|>"
    delta = (
        f"{end}\n<|im_start|>user\n{said_a.text}<|im_end|>\n<|im_start|>user\n{said_b.text}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert t2.prompt_ids == t1.prompt_ids + t1.completion_ids + tok(delta, add_special_tokens=False)["input_ids"]


def _strip_plan(tok):
    from srpo_graph.runtime.chat import ChatPlan

    close = tok.convert_tokens_to_ids("</think>")
    return ChatPlan(
        None,
        tok,
        tok.eos_token_id,
        tok.eos_token,
        "tool",
        close if isinstance(close, int) and close != tok.unk_token_id else None,
    )


def _check_strip(tok, ids):
    """Qwen3's cut, by text: the kept ids decode to ``text.split('</think>')[-1].lstrip('\\n')``, and
    all of them but at most the first are the sampled ids' own tail."""
    got = _strip_plan(tok).strip_think(ids)
    text = tok.decode(ids)
    want = text.split("</think>")[-1].lstrip("\n") if "</think>" in text else text
    assert tok.decode(list(got)) == want, (ids, got)
    assert not got or tuple(ids[len(ids) - len(got) + 1 :]) == tuple(got[1:]), (ids, got)
    return got


def test_think_strip_cuts_by_text_whatever_pieces_the_close_was_sampled_as(qwen3):
    """``</think>`` sampled as its special token or as the BPE pieces ``<`` ``/`` ``think`` ``>``, with
    newlines and words around, several blocks, none: random sequences on qwen3-test's tokenizer."""
    import random

    tok = qwen3[1].tokenizer
    pieces = [
        [tok.convert_tokens_to_ids("</think>")],
        tok("</", add_special_tokens=False)["input_ids"],
        tok("think", add_special_tokens=False)["input_ids"],
        tok(">", add_special_tokens=False)["input_ids"],
        tok("\n", add_special_tokens=False)["input_ids"],
        [266],
        tok("The", add_special_tokens=False)["input_ids"],
        tok(" answer", add_special_tokens=False)["input_ids"],
        [tok.convert_tokens_to_ids("<think>")],
    ]
    assert tok.decode([266]) == "\n \n"  # a token that starts with newlines and goes on
    rng = random.Random(0)
    by_pieces = 0
    for _ in range(400):
        ids = [i for _ in range(rng.randint(1, 14)) for i in rng.choice(pieces)]
        if rng.random() < 0.5:  # a whole close written in pieces
            at = rng.randint(0, len(ids))
            ids[at:at] = (
                tok("</", add_special_tokens=False)["input_ids"] + tok("think>", add_special_tokens=False)["input_ids"]
            )
        got = _check_strip(tok, ids)
        by_pieces += "</think>" in tok.decode(ids) and 1536 not in ids and got != tuple(ids)
    assert by_pieces > 50


def test_think_strip_re_encodes_a_token_the_cut_falls_inside(tmp_path):
    """A byte-level BPE trained here so that ``>`` merges with the newlines and the next word
    (``>\\n\\nThe``): the cut falls inside that token, whose kept text is re-encoded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ["</think>\n\nThe answer is 3. <think>hmm</think>\n\nThe end"] * 50,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    ids = tok("<think>hmm</think>\n\nThe answer", add_special_tokens=False)["input_ids"]
    inside = [i for i in ids if tok.decode([i]).count(">") and not tok.decode([i]).endswith(">")]
    assert inside, [tok.decode([i]) for i in ids]  # the merge this test is about
    got = _check_strip(tok, ids)
    assert tok.decode(list(got)) == "The answer" and got[0] not in ids


def test_a_conversation_that_outgrows_the_context_fails_naming_the_agent_and_turn(qwen3):
    """The model takes len(turn 1's prompt) + max_tokens positions: turn 1 runs, turn 2 (its
    prompt holds turn 1 and the new messages) would not fit and fails the episode (kind
    ``prompt``) with the agent, the turn and the numbers, before any request is sent."""
    from transformers import AutoModelForCausalLM

    path, backend = qwen3
    tok = backend.tokenizer
    first = tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Q: {TASKS[0].fields['question']}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    limit = len(tok(first, add_special_tokens=False)["input_ids"]) + 10  # the talker's max_tokens
    model = AutoModelForCausalLM.from_pretrained(str(path), max_position_embeddings=limit)
    small = Recorder(TransformersBackend(model, tok))
    assert small.context_length == limit
    wf = check(parse(WF.format(model=path, system=SYSTEM, think="keep")))
    result = run(wf, TASKS[:1], {"m": small}, samples=1, seed=0)
    ep = result.episodes[0]
    assert ep.status == "failed" and result.stats.failed_by_kind == {"prompt": 1}
    assert [o.agent for o in ep.outputs] == ["talker", "critic"]
    assert "agent 'talker', turn 2: the prompt (" in ep.error and f"more than the {limit} of policy 'm'" in ep.error
    assert "`memory: chat`" in ep.error and ep.error.startswith("<string>:5:1:")
    assert len(small.calls) == 2  # turn 2 was never sent
