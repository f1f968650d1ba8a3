"""Checking a chat agent's ``system:``, ``memory:`` and ``think:`` items (lang stage, check).

Consumes an agent's chat items and the policies declared so far; produces the agent's
:class:`~srpo_graph.workflow.Chat` (None for a plain agent). Rules: ``memory`` is ``chat`` or
``none``, ``think`` is ``keep`` or ``strip``, references in ``system`` are checked like a
prompt's, an ``openai(...)`` policy takes ``system:`` as its system message but cannot keep a
token-level conversation (``memory: chat``) or ``think:``, and a chat agent's
policy must have a chat template when its tokenizer is on this machine (a model folder: its
``chat_template.jinja`` or the ``chat_template`` of its ``tokenizer_config.json``) or when it is one
of the models srpo-graph builds here, known by name before it is built (``tiny``, ``tiny-reason``
and ``tiny-search`` have none; ``qwen3-test`` and the other ``FAMILY-SIZE`` models have one). A hub name
is read from the Hugging Face cache when it is there (``hfcache.py``, files only); one that is
not is not looked up, and the runtime refuses it at start (``runtime/chat.py``).
Reading a JSON file is all this does: no tokenizer, no transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from srpo_graph.hfcache import cached_snapshot, is_hub_name
from srpo_graph.lang import ast
from srpo_graph.lang.scope import Scope
from srpo_graph.workflow import Chat, Policy, Ref, Template, TextPart

MEMORY = ("none", "chat")
THINK = ("keep", "strip")


def _home() -> Path:
    # the folder models/architectures.default_dir builds into (lang may not import models)
    home = os.environ.get("SRPO_GRAPH_HOME")
    return Path(home) if home else Path.home() / ".cache" / "srpo-graph"


# The models srpo-graph builds here (srpo_graph/models: ``local_names()``), known before they are
# built: the char-level tiny model and the recipes have no chat template, every Qwen/Llama-shaped
# ``FAMILY-SIZE`` model has its family's (lang may not import models: tests/models keeps these in step).
PLAIN_LOCAL_MODELS = ("tiny", "tiny-reason", "tiny-search")
CHAT_FAMILIES = ("qwen2.5", "qwen3", "llama3")
CHAT_SIZES = ("test", "mid", "scale")
# the models on the released tokenizers (models/released.py's SHAPED_MODELS and the recipes of
# models/chat_recipe.py), each with its family's template
CHAT_SHAPED_MODELS = ("qwen2.5-0.5b-2layer", "qwen3-0.6b-2layer", "qwen2.5-realvocab-test", "qwen3-realvocab-test",
                      "llama3-realvocab-test", "qwen3-realvocab-math")


def builtin_chat_template(model: str) -> bool | None:
    """Whether the locally built model ``model`` has a chat template (None: not one of them).

    >>> builtin_chat_template("tiny-search"), builtin_chat_template("qwen3-test"), builtin_chat_template("x/y")
    (False, True, None)
    """
    if model in PLAIN_LOCAL_MODELS:
        return False
    if model in CHAT_SHAPED_MODELS:
        return True
    family, _, size = model.rpartition("-")
    return True if family in CHAT_FAMILIES and size in CHAT_SIZES else None


def has_chat_template(model: str, base_dir: Path | None = None) -> bool | None:
    """Whether the local tokenizer of ``model`` has a chat template (None: no local tokenizer);
    a model srpo-graph builds is known by name, built or not (:func:`builtin_chat_template`).

    >>> has_chat_template("no/such-model") is None
    True
    >>> has_chat_template("tiny-reason")
    False
    """
    known = builtin_chat_template(model)
    if known is not None and not (base_dir is not None and (base_dir / model).is_dir()):
        return known
    candidates = [Path(model)]
    if base_dir is not None:
        candidates.append(base_dir / model)
    if "/" not in model and model:
        candidates.append(_home() / model)
    if is_hub_name(model) and not (base_dir is not None and (base_dir / model).exists()):
        snapshot = cached_snapshot(model)  # the Hugging Face cache, from its files (never the network)
        if snapshot is not None:
            candidates.append(snapshot)
    for c in candidates:
        try:
            config = c / "tokenizer_config.json"
            if not config.is_file():
                continue
            if (c / "chat_template.jinja").is_file():
                return True
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        return bool(isinstance(data, dict) and data.get("chat_template"))
    return None


def template_thinks(model: str, base_dir: Path | None = None) -> bool | None:
    """Whether ``model``'s chat template writes thinking blocks (``<think>``/``</think>``, Qwen3's), so
    that ``think:`` acts on its turns (None: not known here). A model built here is known by name.

    >>> template_thinks("qwen3-test"), template_thinks("llama3-test"), template_thinks("qwen2.5-realvocab-test")
    (True, False, False)
    """
    if builtin_chat_template(model):
        return model.startswith("qwen3")
    folders = [Path(model)] + ([base_dir / model] if base_dir is not None else [])
    if "/" not in model and model:
        folders.append(_home() / model)
    if is_hub_name(model):
        snapshot = cached_snapshot(model)
        if snapshot is not None:
            folders.append(snapshot)
    for folder in folders:
        for name, key in (("chat_template.jinja", None), ("tokenizer_config.json", "chat_template")):
            try:
                text = (folder / name).read_text(encoding="utf-8")
                if key is not None:
                    data = json.loads(text)
                    text = json.dumps(data.get(key)) if isinstance(data, dict) else ""
            except (OSError, ValueError):
                continue
            if text and text != "null":
                return "</think>" in text
    return None


def chat_of(scope: Scope, a: ast.AgentDecl, policy: Policy | None, refs: list[Ref]) -> Chat | None:
    """The :class:`Chat` of agent ``a`` (None when it has no chat item); problems go to ``scope``.
    References of ``system`` are appended to ``refs`` (the agent's references, for the path rules)."""
    items = [i for i in a.items if isinstance(i, (ast.SystemItem, ast.MemoryItem, ast.ThinkItem))]
    if not items:
        return None
    name = a.name.value
    fields: dict = {}
    for i in items:
        if isinstance(i, ast.SystemItem):
            fields["system"] = Template(parts=tuple(template_parts(scope, i.template, refs)), span=i.template.span)
        else:
            word, allowed = ("memory", MEMORY) if isinstance(i, ast.MemoryItem) else ("think", THINK)
            if i.value.value not in allowed:
                scope.err(f"unknown value '{i.value.value}' for `{word}`", i.value.span,
                          f"write `{word}: {allowed[-1]}` or `{word}: {allowed[0]}`", "bad-value")
            else:
                fields[word] = i.value.value
    if policy is None:
        return Chat(**fields)
    if policy.external is not None:
        # an endpoint takes messages: `system:` is its system message (issue 39, item 4); a kept
        # conversation (`memory: chat`) and `think:` are token-level rules a text API cannot follow
        for item in items:
            if isinstance(item, ast.SystemItem):
                continue
            scope.err(f"agent '{name}' sets `{_item_word(item)}` on policy '{policy.name}', an openai(...) "
                      "endpoint that takes text, not token ids", item.span,
                      f"drop `{_item_word(item)}` for this agent (`system:` is sent as the system message), or "
                      "give it a local policy", "no-chat-template")
    elif policy.external is None and has_chat_template(policy.model, scope.base_dir) is False:
        scope.err(f"agent '{name}' is a chat agent, but policy '{policy.name}' (model \"{policy.model}\") "
                  "has no chat template", items[0].span,
                  "use a chat model (e.g. \"qwen3-test\", built here by `srpo-graph init-model --model "
                  "qwen3-test`), or drop `system`, `memory` and `think` to send one plain prompt per turn",
                  "no-chat-template")
    return Chat(**fields)


def _item_word(item) -> str:
    """The keyword of a chat item (``system``, ``memory`` or ``think``)."""
    if isinstance(item, ast.MemoryItem):
        return "memory:"
    return "think:" if isinstance(item, ast.ThinkItem) else "system:"


def template_parts(scope, template, refs: list[Ref]) -> list[TextPart | Ref]:
    """A template's parts, each reference typed (errors reported by ``scope``) and added to ``refs``:
    the one reading of a prompt or a system prompt."""
    parts: list[TextPart | Ref] = []
    for p in template.parts:
        if isinstance(p, ast.Ref):
            scope.ref_type(p)
            r = Ref(path=p.path, optional=p.optional, span=p.span)
            refs.append(r)
            parts.append(r)
        else:
            parts.append(TextPart(text=p.text))
    return parts
