"""Frozen and external policies in the language (issue 28): parse, check, format, summary, viz labels,
and every located error of the kind (external base of an adapter, `allow:` / `top_k` on an external
policy's agent, a frozen adapter, bad openai arguments, an API key written in the file)."""

from __future__ import annotations

import pytest

from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import check, format_source, parse
from srpo_graph.lang.summary import summary
from srpo_graph.viz.text import to_dot

OK = """workflow fv
import std
task { question: text }
policy solver = "tiny"
policy judge = "tiny" frozen
policy api = openai("http://127.0.0.1:30000/v1", model="m", api_key_env="KEY", timeout=5, retries=1, concurrency=2)
agent s { policy: solver prompt: "{task.question}" }
agent v { policy: judge prompt: "{s}" }
agent x { policy: api prompt: "{s}" sample { temperature: 0.5, max_tokens: 8, stop: ["\\n"] } }
transition t1 { consume: s activate: v, x }
transition t2 { consume: v, x activate: end }
start: s
"""


def test_frozen_and_external_policies_check():
    w = check(parse(OK, "fv.wf"))
    by = w.policy_by_name
    assert not by["solver"].frozen and by["judge"].frozen and by["judge"].external is None
    ext = by["api"].external
    assert by["api"].frozen and ext is not None
    assert (ext.url, ext.model, ext.api_key_env, ext.timeout, ext.retries, ext.concurrency) == (
        "http://127.0.0.1:30000/v1", "m", "KEY", 5.0, 1, 2)
    assert w.trained_policies == ("solver",) and w.untrained_policies == {"judge", "api"}


def test_summary_says_which_agents_train():
    text = summary(check(parse(OK, "fv.wf")))
    assert "training:    trains s [solver]" in text
    assert "frozen v [judge]" in text and "external (frozen) x [api]" in text


def test_viz_labels_frozen_policies():
    dot = to_dot(check(parse(OK, "fv.wf")))
    assert "judge (frozen)" in dot and "api (external, frozen)" in dot and "solver (frozen)" not in dot


def test_format_round_trips():
    once = format_source(OK)
    assert 'policy judge = "tiny" frozen' in once
    assert (
        'openai("http://127.0.0.1:30000/v1", model="m", api_key_env="KEY", timeout=5, retries=1, concurrency=2)' in once
    )
    assert format_source(once) == once
    assert check(parse(once)).policy_by_name["api"].external == check(parse(OK)).policy_by_name["api"].external


BAD = [
    # (replace in OK, the text the error points at (its first occurrence), words of the message)
    (
        'policy api = openai("http://127.0.0.1:30000/v1", model="m", api_key_env="KEY", timeout=5, retries=1, '
        'concurrency=2)',
        'policy api = openai("ftp://x", model="m")',
        '"ftp',
        "is not an http(s) URL",
    ),
    ('api_key_env="KEY"', 'api_key="sk-123"', "api_key=", "never written in a workflow file"),
    ("timeout=5", "tmeout=5", "tmeout", "unknown openai argument 'tmeout'"),
    ("retries=1", "retries=-1", "-1", "`retries` must be"),
    ("concurrency=2", "concurrency=0", "0)", "`concurrency` must be"),
    ('model="m"', "model=3", "3,", "`model` must be"),
    ("sample { temperature", 'sample { allow: ["a"], temperature', "allow", "cannot honour `allow`"),
    ("sample { temperature", "sample { top_k: 3, temperature", "top_k", "cannot honour `top_k`"),
    ('policy judge = "tiny" frozen', 'policy judge = lora("api", r=4)', '"api', "cannot be the base of adapter"),
    ('policy judge = "tiny" frozen', 'policy judge = lora("solver", r=4) frozen', "frozen", "cannot be frozen"),
]


@pytest.mark.parametrize("old,new,at,words", BAD, ids=[b[3][:30] for b in BAD])
def test_located_errors(old, new, at, words):
    assert old in OK
    with pytest.raises(WorkflowCheckError) as e:
        check(parse(OK.replace(old, new), "fv.wf"))
    hits = [d for d in e.value.diagnostics if words in d.message]
    assert hits, [d.message for d in e.value.diagnostics]
    source = OK.replace(old, new)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if new in text)
    col = source.splitlines()[line - 1].index(at) + 1
    assert (hits[0].span.line, hits[0].span.col) == (line, col), str(e.value)


def test_system_on_an_external_policy_is_its_system_message():
    """Issue 39, item 4: chat APIs have a system role; `system:` on an openai(...) agent is sent as the
    request's system message (tests/backends/test_external_messages.py)."""
    src = OK.replace('agent x { policy: api prompt: "{s}"', 'agent x { policy: api system: "You check." prompt: "{s}"')
    wf = check(parse(src, "fv.wf"))
    assert wf.agent_by_name["x"].chat is not None and wf.agent_by_name["x"].chat.system is not None


@pytest.mark.parametrize("item", ["memory: chat", "think: strip", "memory: none"])
def test_every_token_level_chat_item_on_an_external_policy_is_a_located_error(item):
    """An openai(...) endpoint takes text: a chat item the runtime renders as token ids (a kept
    conversation, `think:`) is refused by `check`, at the item's line, not at run time."""
    src = OK.replace('agent x { policy: api prompt: "{s}"', f'agent x {{ policy: api {item} prompt: "{{s}}"')
    with pytest.raises(WorkflowCheckError) as info:
        check(parse(src, "fv.wf"))
    d = info.value.diagnostics[0]
    assert d.code == "no-chat-template" and d.span.line == 9 and "openai(...) endpoint" in d.message
