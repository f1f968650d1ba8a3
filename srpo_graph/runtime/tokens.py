"""Static token checks of a workflow against its policies' tokenizers (when they are local).

Runtime stage (it needs the backends' tokenizers; ``check`` reaches it through the CLI). Consumes
a checked :class:`~srpo_graph.workflow.Workflow` and a tokenizer per policy; produces
diagnostics: an ``allow`` entry that is not exactly one token is an error (sampling could never
be constrained to it), so is a chat agent on a tokenizer without a chat template, literal prompt text the tokenizer
turns into its unknown token is a
warning (``<judge>`` silently becoming ``<unk>`` for the tiny model). Only tokenizers found on
this machine are used -- ``"tiny"``, local model folders and, offline, hub names in the Hugging
Face cache (models/hub.py) -- never a download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from srpo_graph.errors import Diagnostic
from srpo_graph.models import resolve_model
from srpo_graph.runtime.prompts import single_token_id
from srpo_graph.workflow import TextPart, Workflow

TINY = "tiny"


def local_tokenizers(workflow: Workflow) -> dict[str, Any]:
    """A tokenizer for every policy whose model is on this machine (``tiny`` or a folder)."""
    from srpo_graph.hfcache import cached_snapshot, is_hub_name, is_offline
    from srpo_graph.models.tiny import load_tokenizer

    out = {}
    for pol in workflow.policies:
        if pol.external is not None:
            continue
        if pol.model == TINY or (Path(pol.model).is_dir() and any(Path(pol.model).glob("tokenizer*"))):
            out[pol.name] = load_tokenizer(resolve_model(pol.model))
        elif is_offline() and is_hub_name(pol.model):  # a hub name in the local cache: read, never fetched
            snapshot = cached_snapshot(pol.model)
            if snapshot is not None and any(snapshot.glob("tokenizer*")):
                out[pol.name] = load_tokenizer(snapshot)
    return out


def _unknown_chars(tok: Any, text: str) -> list[str]:
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or unk not in tok(text, add_special_tokens=False)["input_ids"]:
        return []
    return sorted({c for c in text if unk in tok(c, add_special_tokens=False)["input_ids"]}, key=text.index)


def token_diagnostics(workflow: Workflow, tokenizers: Mapping[str, Any]) -> list[Diagnostic]:
    """The token problems of ``workflow`` for the given ``{policy: tokenizer}`` (others skipped).

    >>> from srpo_graph.lang import parse, check
    >>> wf = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "<judge>x" '
    ...                  'sample { allow: ["0", "10"] } } transition t { consume: a activate: end } start: a'))
    >>> [(d.severity, d.code) for d in token_diagnostics(wf, local_tokenizers(wf))]
    [('error', 'bad-token'), ('warning', 'unknown-token')]
    """
    diags: list[Diagnostic] = []
    for agent in workflow.agents:
        tok = tokenizers.get(agent.policy)
        if tok is None:
            continue
        if agent.chat is not None and not getattr(tok, "chat_template", None):  # lang/chat.py reads built folders
            diags.append(
                Diagnostic(
                    f"agent '{agent.name}' is a chat agent, but policy '{agent.policy}''s tokenizer has no chat "
                    f"template",
                    agent.span,
                    'use a chat model (e.g. "qwen3-test"), or drop `system`, `memory` and `think`',
                    code="no-chat-template",
                )
            )
        bad = [s for s in agent.sampling.allow or () if single_token_id(tok, s) is None]
        if bad:
            diags.append(
                Diagnostic(
                    f"agent '{agent.name}': allow entries {bad} are not single tokens of policy '{agent.policy}'",
                    agent.span,
                    "each `allow` string must be exactly one token of the policy's tokenizer"
                    + (" (see `srpo-graph init-model --show-vocab`)" if _is_tiny(workflow, agent.policy) else ""),
                    code="bad-token",
                )
            )
        literal = "".join(p.text for p in agent.template.parts if isinstance(p, TextPart))
        unknown = _unknown_chars(tok, literal)
        if unknown:
            diags.append(
                Diagnostic(
                    f"agent '{agent.name}': prompt text {', '.join(repr(c) for c in unknown)} is not in policy "
                    f"'{agent.policy}''s vocabulary (it becomes the unknown token)",
                    agent.template.span or agent.span,
                    "use characters and role tokens the tokenizer knows"
                    + (" (see `srpo-graph init-model --show-vocab`)" if _is_tiny(workflow, agent.policy) else ""),
                    severity="warning",
                    code="unknown-token",
                )
            )
    return diags


def _is_tiny(workflow: Workflow, policy: str) -> bool:
    return any(p.name == policy and p.model == TINY for p in workflow.policies)


def check_local_tokens(workflow: Workflow) -> list[Diagnostic]:
    """:func:`token_diagnostics` with :func:`local_tokenizers` (what ``srpo-graph check`` runs)."""
    return token_diagnostics(workflow, local_tokenizers(workflow))


def cached_tokenizer(model: str) -> Any | None:
    """The tokenizer of a policy's ``model`` string when it is on this machine, else None.

    ``tiny`` (built in code, seconds), a recipe already built (never built here: that takes
    minutes), a local folder, or a hub name already in the Hugging Face cache
    (``local_files_only``): never a download.
    """
    from srpo_graph.models.recipes import RECIPES, default_dir
    from srpo_graph.models.tiny import load_tokenizer

    try:
        if model == TINY:
            return load_tokenizer(resolve_model(model))
        if model in RECIPES:
            built = default_dir(model)
            return load_tokenizer(built) if any(built.glob("tokenizer*")) else None
        from srpo_graph.models.architectures import LOCAL_MODELS
        from srpo_graph.models.architectures import default_dir as local_dir

        if model in LOCAL_MODELS:  # qwen3-test & co.: read once built (building takes seconds, not done here)
            built = local_dir(model)
            return load_tokenizer(built) if any(built.glob("tokenizer*")) else None
        if Path(model).is_dir():
            return load_tokenizer(model)
        from srpo_graph.hfcache import cached_snapshot, is_hub_name

        snapshot = cached_snapshot(model) if is_hub_name(model) else None
        if snapshot is not None:  # the standard cache, read from its files (offline or not)
            return load_tokenizer(snapshot)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception:  # noqa: BLE001 - no local copy (or a damaged one): the caller says prompts stay undecoded
        return None
