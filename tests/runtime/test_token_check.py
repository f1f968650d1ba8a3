"""`check` checks `allow` entries and prompt text against a local tokenizer (issue 12, item 18),
and `init-model --show-vocab` shows the tiny model's vocabulary (item 20)."""

from __future__ import annotations

from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.lang import check, parse
from srpo_graph.models.tiny import ROLE_TOKENS, VOCAB
from srpo_graph.runtime.tokens import local_tokenizers, token_diagnostics

WF = '''workflow w
import std
policy tiny = "tiny"
agent j {
  policy: tiny
  prompt: "<judge>: yes or no?"
  sample { allow: ["0", "yes", "1"] }
}
transition t { consume: j activate: end }
start: j
'''


def test_a_bad_allow_entry_is_an_error_and_unknown_prompt_text_a_warning(tmp_path):
    path = tmp_path / "w.wf"
    path.write_text(WF)
    r = CliRunner().invoke(app, ["check", str(path)])
    assert r.exit_code == 2, r.output
    assert f"{path}:4:1: error: agent 'j': allow entries ['yes'] are not single tokens of policy 'tiny'" in r.output
    assert f"{path}:6:11: warning: agent 'j': prompt text '<', '>' is not in policy 'tiny''s vocabulary" in r.output
    assert "init-model --show-vocab" in r.output
    assert CliRunner().invoke(app, ["check", "--no-tokens", str(path)]).exit_code == 0


def test_role_tokens_and_single_characters_are_fine():
    src = WF.replace('"<judge>: yes or no?"', '"<a><sep>yes or no?"').replace('"yes", ', "")
    wf = check(parse(src))
    assert token_diagnostics(wf, local_tokenizers(wf)) == []


def test_a_hub_model_is_never_downloaded_for_the_check():
    wf = check(parse(WF.replace('policy tiny = "tiny"', 'policy tiny = "Qwen/Qwen2.5-0.5B-Instruct"')))
    assert local_tokenizers(wf) == {} and token_diagnostics(wf, {}) == []


def test_init_model_shows_the_tiny_vocabulary(tmp_path):
    r = CliRunner().invoke(app, ["init-model", str(tmp_path / "tiny"), "--show-vocab"])
    assert r.exit_code == 0, r.output
    assert f"vocabulary: {len(VOCAB)} tokens" in r.output and " ".join(ROLE_TOKENS) in r.output
    for i, tok in enumerate(VOCAB):
        assert f"{i:3d}  {tok!r}" in r.output
