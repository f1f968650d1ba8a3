"""``check``'s advice about the models a workflow names: warnings, never errors.

Stage: lang (check). Consumes a checked :class:`~srpo_graph.workflow.Workflow`; produces warning
diagnostics for the traps that cost users time (each names its ``.wf`` line and the fix):

* ``tiny-lora`` -- a LoRA adapter on the random-init ``tiny`` model: adapters on a random base
  cannot learn (docs/lora.md, *adapters vs full copies*); ``tiny-reason`` or a real model can.
* ``tiny-greedy`` -- the random-init ``tiny`` model, before training, puts its highest
  probability on the prompt's last token (it copies it). An agent on it whose prompt ends with a
  reference (``"<a>{task.target}"``) gets that value back under greedy decoding -- and ``train``'s evaluation is
  greedy by default (``eval.mode``), so a
  held-out score before any training can be the maximum. Said once per workflow.
* ``think-no-effect`` -- ``think:`` on an agent whose policy's chat template never writes a
  ``<think>`` block (Llama 3, Qwen2.5): the setting would change nothing.
* ``frozen-base`` -- an agent on a policy that is the base of adapters: the base is frozen, so
  that agent never learns (its outputs still count in their active sets).

It knows nothing about the training config: a run with ``rollout.models`` overrides may not use
``tiny`` at all (the hints say how to silence nothing but to choose).
"""

from __future__ import annotations

from pathlib import Path

from srpo_graph.errors import Diagnostic
from srpo_graph.lang.chat import template_thinks
from srpo_graph.workflow import Ref, Workflow

TINY = "tiny"


def model_advice(workflow: Workflow) -> list[Diagnostic]:
    """The model warnings of ``workflow`` (module docstring), in declaration order.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std task { x: int } policy p = "tiny" agent a { policy: p '
    ...                 'prompt: "<a>{task.x}" } transition t { consume: a activate: end } start: a'))
    >>> [d.code for d in model_advice(w)]
    ['tiny-greedy']
    """
    out: list[Diagnostic] = []
    policies = {p.name: p for p in workflow.policies}
    for p in workflow.policies:
        if p.adapter is not None and p.model == TINY:
            out.append(
                Diagnostic(
                    f"policy '{p.name}' is a LoRA adapter on the random-init `tiny` model: adapters on an untrained "
                    "base cannot learn (docs/lora.md)",
                    p.span,
                    f'base it on a trained model: `tiny-reason` or a real one (in a run: '
                    f'rollout.models={{"{p.adapter.base}"'
                    '="tiny-reason"})',
                    "warning",
                    "tiny-lora",
                )
            )
    bases: dict[str, list[str]] = {p.adapter.base: [] for p in workflow.policies if p.adapter is not None}
    for p in workflow.policies:
        if p.adapter is not None:
            bases[p.adapter.base].append(p.name)
    for a in workflow.agents:
        if a.policy in bases:
            out.append(
                Diagnostic(
                    f"agent '{a.name}' samples from policy '{a.policy}', the frozen base of adapters "
                    f"{', '.join(bases[a.policy])}: it is never trained, so this agent does not learn",
                    a.span,
                    "give it its own adapter (`policy p = lora(...)`) or a full policy of its own if it should learn",
                    "warning",
                    "frozen-base",
                )
            )
    for a in workflow.agents:
        pol = policies.get(a.policy)
        if pol is None or pol.model != TINY:
            continue
        parts = a.template.parts
        if parts and isinstance(parts[-1], Ref):
            why = f"its prompt ends with {{{parts[-1]}}}"
            out.append(
                Diagnostic(
                    f"agent '{a.name}' is on the random-init `tiny` model, which before training copies the prompt's "
                    f"last token under greedy decoding, and {why}: a greedy evaluation (train's eval.mode=greedy, "
                    "the default) can score the maximum before any training",
                    a.template.span or a.span,
                    "measure learning with eval.mode=sampled, or train a model that has learned something "
                    "(`tiny-reason`)",
                    "warning",
                    "tiny-greedy",
                )
            )
            break  # once per workflow: the same cause for every such agent
    for a in workflow.agents:  # `think:` on a model whose template never writes a thinking block
        pol = policies.get(a.policy)
        if a.chat is None or "think" not in a.chat.model_fields_set or pol is None or pol.external is not None:
            continue
        base = Path(pol.span.path).parent if pol.span is not None and not pol.span.path.startswith("<") else None
        if template_thinks(pol.model, base) is False:
            out.append(
                Diagnostic(
                    f"agent '{a.name}' sets `think: {a.chat.think}`, but the chat template of policy '{pol.name}' "
                    f"(model \"{pol.model}\") writes no `<think>` blocks: `think:` changes nothing for it",
                    a.span,
                    "drop `think:`, or use a model whose template thinks (Qwen3, e.g. \"qwen3-test\")",
                    "warning",
                    "think-no-effect",
                )
            )
    return out
