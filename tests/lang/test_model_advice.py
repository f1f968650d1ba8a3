"""``check``'s model warnings: LoRA on the random ``tiny`` model, greedy evaluation on it, agents on a
frozen adapter base -- each on its ``.wf`` line, on the shipped workflows and small variants; and
the fact the greedy warning rests on, checked on the real tiny model."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.lang import parse
from srpo_graph.lang.checker import check_module

ROOT = Path(__file__).resolve().parents[2]


def _codes(text: str) -> list[tuple[str, int]]:
    return [(d.code, d.span.line) for d in check_module(parse(text, "<w>")).warnings]


def test_lora_on_tiny_and_greedy_on_tiny_are_warned_on_their_lines():
    text = (ROOT / "workflows" / "coord_lora2.wf").read_text()
    lines = text.splitlines()
    role_a = next(i for i, s in enumerate(lines, 1) if s.startswith("policy role_a"))
    role_b = next(i for i, s in enumerate(lines, 1) if s.startswith("policy role_b"))
    prompt_a = next(i for i, s in enumerate(lines, 1) if 'prompt: "<a>' in s)
    assert _codes(text) == [("tiny-lora", role_a), ("tiny-lora", role_b), ("tiny-greedy", prompt_a)]
    # on a trained base nothing is said
    assert _codes(text.replace('policy base = "tiny"', 'policy base = "tiny-reason"')) == []


def test_an_agent_on_the_frozen_base_is_warned():
    text = (
        (ROOT / "workflows" / "coord_lora2.wf")
        .read_text()
        .replace('policy base = "tiny"', 'policy base = "tiny-reason"')
    )
    text = text.replace("  policy: role_b\n", "  policy: base\n")
    text = text.replace('policy role_b = lora("base", r=8, alpha=16, targets=[q_proj, k_proj, v_proj, o_proj])\n', "")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("agent b"))
    diags = check_module(parse(text, "<w>")).warnings
    assert [(d.code, d.span.line) for d in diags] == [("frozen-base", line)]
    assert "adapters role_a" in diags[0].message and "does not learn" in diags[0].message


def test_greedy_warning_only_when_the_prompt_ends_with_a_reference():
    text = (ROOT / "workflows" / "coord_routed.wf").read_text()
    assert [c for c, _ in _codes(text)] == ["tiny-greedy"]  # once per workflow, at the first such agent
    ended = text.replace('"<r>{task.route}"', '"<r>{task.route}<sep>"').replace(
        '"<a>{task.target}"', '"<a>{task.target}<sep>"'
    )
    ended = ended.replace('"<b>{task.target}"', '"<b>{task.target}<sep>"').replace(
        '"<c>{task.target}"', '"<c>{task.target}<sep>"'
    )
    assert _codes(ended) == []


def test_the_tiny_model_copies_the_prompts_last_token_greedily():
    """What `tiny-greedy` says, on the real model: greedy decoding returns the prompt's last token."""
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer

    path = ensure_tiny_model()
    model, tok = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), load_tokenizer(path)
    for prompt in ("<a>7", "<b>3<sep>5", "<r>abc", "<c>12<sep>0<sep>9"):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
        assert nxt == int(ids[0, -1]), prompt


def test_check_prints_the_warnings_and_succeeds():
    res = CliRunner().invoke(app, ["check", str(ROOT / "workflows" / "coord_lora2.wf")])
    assert (
        res.exit_code == 0
        and "warning: policy 'role_a' is a LoRA adapter on the random-init `tiny` model" in res.output
    )


def test_think_on_a_model_whose_template_never_thinks_is_warned(tmp_path):
    """Issue 39, item 6: `think:` on a Llama model changed nothing and said nothing. Every model built here
    by name, and a model folder by its template's text."""
    path = str(ROOT / "workflows" / "chat_search_qwen3.wf")  # its chat_tools.py is found next to it
    text = Path(path).read_text()
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith("agent searcher"))
    assert "think: strip" in text

    def _codes(text: str) -> list[tuple[str, int]]:
        return [(d.code, d.span.line) for d in check_module(parse(text, path)).warnings]

    assert _codes(text) == []  # qwen3-test's template writes <think> blocks
    for model in ("llama3-test", "qwen2.5-test", "llama3-realvocab-test"):
        assert _codes(text.replace('"qwen3-test"', f'"{model}"')) == [("think-no-effect", line)], model
    assert _codes(text.replace('"qwen3-test"', '"llama3-test"').replace("  think: strip\n", "")) == []
    folder = tmp_path / "m"  # a model folder: its template is read, nothing is loaded
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert _codes(text.replace('"qwen3-test"', f'"{folder}"')) == [("think-no-effect", line)]
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}<think></think>"}')
    assert _codes(text.replace('"qwen3-test"', f'"{folder}"')) == []
