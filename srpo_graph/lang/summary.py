"""The short, human summary ``srpo-graph check`` prints for a valid workflow.

Stage: lang (check). Consumes a checked :class:`~srpo_graph.workflow.Workflow` (and optionally
the checker's episode bound); produces text. Knows nothing of parsing.
"""

from __future__ import annotations

from srpo_graph.workflow import END, ActivateAgents, ActivateEnd, ActivateRoute, Workflow, type_str


def _sizes(sizes: tuple[int, ...]) -> str:
    if not sizes:
        return "?"
    lo, hi = min(sizes), max(sizes)
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _activation(t) -> str:
    act = t.activate
    if isinstance(act, ActivateEnd):
        return END
    if isinstance(act, ActivateAgents):
        return ", ".join(act.agents)
    cases = "; ".join(f"{label} -> {', '.join(ts)}" for label, ts in act.cases)
    return f"route {act.on} {{{cases}}}"


def _adapter_lines(w: Workflow) -> list[str]:
    """One line per shared base: which agents sample from it and which adapter each trains."""
    rows = []
    for base in (p for p in w.policies if p.name in w.frozen_bases):
        users = [f"{a.name} [{a.policy}]" for a in w.agents if a.policy == base.name]
        parts = [f"{', '.join(users)} sample the frozen base"] if users else []
        for pol in w.policies:
            if pol.adapter is None or pol.adapter.base != base.name:
                continue
            agents = ", ".join(a.name for a in w.agents if a.policy == pol.name) or "no agent"
            parts.append(f"{agents} train adapter {pol.name} (r={pol.adapter.r})")
        rows.append(f'{base.name} "{base.model}" loaded once: ' + "; ".join(parts))
    return ["  adapters:    " + "\n               ".join(rows)] if rows else []


def _training_lines(w: Workflow) -> list[str]:
    """Which agents train and which do not (shown when a policy is declared frozen or external)."""
    if not any(p.frozen or p.external is not None for p in w.policies):
        return []

    def agents_of(names) -> str:
        return ", ".join(f"{a.name} [{a.policy}]" for a in w.agents if a.policy in names) or "none"

    kind = {p.name: "external" if p.external is not None else "frozen" for p in w.policies
            if p.name in w.untrained_policies}
    trained = agents_of(set(w.trained_policies))
    frozen = agents_of({n for n, k in kind.items() if k == "frozen"})
    external = agents_of({n for n, k in kind.items() if k == "external"})
    rows = [f"trains {trained}"] if w.trained_policies else ["trains nothing (`train` refuses this workflow)"]
    rows += [f"frozen {frozen}"] if frozen != "none" else []
    rows += [f"external (frozen) {external}"] if external != "none" else []
    return ["  training:    " + "\n               ".join(rows)]


def summary(workflow: Workflow, max_firings: int | None = None, bound_reason: str = "") -> str:
    """A few lines: agents and policies, transitions with set sizes, routers, the episode bound.

    Args:
        workflow: a checked workflow.
        max_firings: the proven bound on transition firings (default: ``max_steps``).
        bound_reason: why that bound holds, shown in parentheses.

    Returns:
        The text ``srpo-graph check`` prints.

    >>> from srpo_graph.lang.parser import parse
    >>> from srpo_graph.lang.checker import check
    >>> w = check(parse('workflow w\\nimport std\\npolicy p = "tiny"\\nagent a { policy: p prompt: "x" }\\n'
    ...                 'transition t { consume: a activate: end }\\nstart: a'))
    >>> print(summary(w))  # doctest: +NORMALIZE_WHITESPACE
    w  (<string>)
      policies:    p = "tiny"
      agents:      a [p] -> text
      transitions: t  consumes a  set size 1  -> end
      start:       a
      episode:     at most 32 transition firings (max_steps)
    """
    w = workflow
    lines = [f"{w.name}  ({w.path})" + (f"  {w.description}" if w.description else "")]
    lines.append("  policies:    " + ", ".join(f"{p.name} = {p.label()}" for p in w.policies))
    lines.extend(_adapter_lines(w))
    lines.extend(_training_lines(w))
    agents = [f"{a.name} [{a.policy}] -> {type_str(a.output)}" + _chat_label(a) for a in w.agents]
    lines.append("  agents:      " + ("\n               ".join(agents) if agents else "none"))
    rows = []
    for t in w.transitions:
        policies = sorted({w.agent_by_name[a].policy for a in t.consume if a in w.agent_by_name})
        extra = []
        if t.tools:
            extra.append("tools " + ", ".join(f"{tc.name}={tc.call.qualname}" for tc in t.tools))
        if t.reward is not None:
            extra.append(f"reward {t.reward.qualname}")
        if t.max_rounds:
            extra.append(f"max_rounds {t.max_rounds}")
        label = "set size" if len(set(t.set_sizes)) <= 1 else "set sizes"
        pol = f" [{', '.join(policies)}]" if len(policies) > 1 else ""
        rows.append(f"{t.name}  consumes {', '.join(t.consume)}{pol}  {label} {_sizes(t.set_sizes)}"
                    f"  -> {_activation(t)}" + ("  (" + "; ".join(extra) + ")" if extra else ""))
    lines.append("  transitions: " + "\n               ".join(rows))
    routers = [t.activate for t in w.transitions if isinstance(t.activate, ActivateRoute)]
    if routers:
        lines.append("  routers:     " + "\n               ".join(
            f"{r.on} -> " + " | ".join(sorted({x for _, ts in r.cases for x in ts})) for r in routers))
    lines.append("  start:       " + ", ".join(w.start))
    if w.reward is not None:
        lines.append(f"  reward:      {w.reward.qualname} (terminal)")
    bound = w.max_steps if max_firings is None else max_firings
    reason = bound_reason or "max_steps"
    lines.append(f"  episode:     at most {bound} transition firing{'s' if bound != 1 else ''} ({reason})")
    return "\n".join(lines)


def _chat_label(a) -> str:
    """``  (chat: memory, think strip)`` for a chat agent (docs/language.md "Chat agents"), else ``""``."""
    if a.chat is None:
        return ""
    parts = ["memory" if a.chat.memory == "chat" else "one turn"] + (["think strip"] if a.chat.think == "strip" else [])
    return f"  (chat: {', '.join(parts)})"
