"""Prompt tokenization: the model's chat template when it has one, the plain encoding otherwise.

Real tokenizers only: the tiny tokenizer, and a copy of it given a small Jinja chat template,
saved with ``save_pretrained`` and loaded back with ``from_pretrained`` as any model's would be.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from srpo_graph.backends.transformers import TransformersBackend
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.prompts import encode_prompt, encode_prompts
from srpo_graph.runtime.render import State, render
from tests.support import workflows as wfs

# every piece is one token of the tiny vocabulary: <q>, <sep>, <s>
TEMPLATE = ("{% for m in messages %}<q>{{ m['content'] }}<sep>{% endfor %}"
            "{% if add_generation_prompt %}<s>{% endif %}")


def _chat_tokenizer(tiny_backend, tmp_path) -> PreTrainedTokenizerFast:
    tok = tiny_backend.tokenizer
    src = tmp_path / "src"
    tok.save_pretrained(src)
    copy = PreTrainedTokenizerFast.from_pretrained(src)
    copy.chat_template = TEMPLATE
    copy.save_pretrained(tmp_path / "chat")
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path / "chat", padding_side="left")
    assert loaded.chat_template == TEMPLATE and not getattr(tok, "chat_template", None)
    return loaded


def _chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _rendered_prompts(wf, ep):
    """(output, its rendered prompt text), replaying the episode's state."""
    state = State(task={"target": int(ep.task_id[1:])})
    for out in ep.outputs:
        yield out, render(wf.agent_by_name[out.agent].template, state)
        state.values[out.agent] = out.value


def test_recorded_prompt_ids_use_the_chat_template(tiny_backend, coord_tasks, tmp_path):
    chat_tok = _chat_tokenizer(tiny_backend, tmp_path)
    backend = TransformersBackend(tiny_backend.model, chat_tok)
    wf = wfs.coord_seq()
    res = run(wf, coord_tasks[:3], {"tiny": backend}, samples=2, seed=5)
    seen = 0
    for ep in res.episodes:
        assert ep.status == "ok"
        for out, text in _rendered_prompts(wf, ep):
            expected = _chat_ids(chat_tok, text)
            assert out.prompt_ids == expected
            assert chat_tok.decode(out.prompt_ids) == f"<q>{text}<sep><s>"
            assert out.prompt_ids != chat_tok(text)["input_ids"]  # not the plain encoding
            seen += 1
    assert seen == 12


def test_without_a_template_the_plain_encoding_is_used(tiny_backend, coord_tasks):
    tok = tiny_backend.tokenizer
    wf = wfs.coord_seq()
    res = run(wf, coord_tasks[:3], {"tiny": tiny_backend}, samples=2, seed=5)
    for ep in res.episodes:
        for out, text in _rendered_prompts(wf, ep):
            assert out.prompt_ids == tok(text)["input_ids"]
            assert out.prompt_ids[0] == tok.bos_token_id  # the tiny tokenizer adds <bos> itself


def test_batched_encoding_equals_one_at_a_time(tiny_backend, tmp_path):
    texts = ["<a>7", "<b>12<sep>3", "", "hello, world!", "<a>7"]
    for tok in (tiny_backend.tokenizer, _chat_tokenizer(tiny_backend, tmp_path)):
        reference = [_chat_ids(tok, t) if tok.chat_template else tok(t)["input_ids"] for t in texts]
        assert encode_prompts(tok, texts) == reference
        assert [encode_prompt(tok, t) for t in texts] == reference
