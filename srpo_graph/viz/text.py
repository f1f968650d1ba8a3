"""Text forms of the routing graph: Graphviz DOT and Mermaid.

Stage: viz. Consumes a :class:`~srpo_graph.workflow.Workflow`, produces text that is exact by
construction (one node per agent/transition, one edge per graph edge). Agents are rounded
boxes coloured by policy, transitions are bars annotated with their set sizes.
"""

from __future__ import annotations

from srpo_graph.workflow import END, Workflow

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


def policy_colors(w: Workflow) -> dict[str, str]:
    """One colour per policy, in declaration order (the palette repeats after nine).

    Args:
        w: a workflow.

    Returns:
        ``{policy name: "#rrggbb"}``.
    """
    return {p.name: PALETTE[i % len(PALETTE)] for i, p in enumerate(w.policies)}


def policy_caption(w: Workflow, name: str) -> str:
    """What an agent box says about its policy: ``p``, ``solver: lora r=16 on base`` (an
    adapter it trains on a shared base) or ``base (frozen)`` (the base itself, not trained)."""
    pol = w.policy_by_name.get(name)
    if pol is not None and pol.adapter is not None:
        return f"{name}: lora r={pol.adapter.r} on {pol.adapter.base}"
    if pol is not None and pol.external is not None:
        return f"{name} (external, frozen)"
    return f"{name} (frozen)" if name in w.frozen_bases or (pol is not None and pol.frozen) else name


def legend_label(w: Workflow, name: str) -> str:
    """A policy's entry in a picture's legend: ``p = tiny``, ``judge = tiny (frozen)``, ``base = tiny
    (frozen base)``, ``s = lora("base", r=8, ...)``, ``v = openai("http://...", model="m") (external, frozen)``:
    the model as declared, then the policy's status once.

    >>> from srpo_graph.lang import load_workflow
    >>> w = load_workflow("workflows/selfplay_frozen.wf")
    >>> legend_label(w, "past")
    'past = tiny (frozen)'
    """
    pol = w.policy_by_name[name]
    if pol.external is not None:
        return f"{name} = {pol.external.label()} (external, frozen)"
    if pol.adapter is not None:
        return f"{name} = {pol.adapter.label()}"
    status = " (frozen base)" if name in w.frozen_bases else " (frozen)" if pol.frozen else ""
    return f"{name} = {pol.model}{status}"


def sizes_label(sizes: tuple[int, ...]) -> str:
    """``|S|=1`` or ``|S|=1..3``.

    >>> sizes_label((1, 2, 3))
    '|S|=1..3'
    """
    if not sizes:
        return "|S|=?"
    lo, hi = min(sizes), max(sizes)
    return f"|S|={lo}" if lo == hi else f"|S|={lo}..{hi}"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(w: Workflow) -> str:
    """The routing graph in Graphviz DOT.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> print(to_dot(w).splitlines()[0])
    digraph "w" {
    """
    colors = policy_colors(w)
    out = [f"digraph {_q(w.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica"];',
           '  "start" [shape=circle, label="", style=filled, fillcolor=black, width=0.2];',
           f'  {_q(END)} [shape=doublecircle, label="", style=filled, fillcolor=black, width=0.15];']
    for a in w.agents:
        out.append(
            f'  {_q(a.name)} [shape=box, style="rounded,filled", fillcolor={_q(colors.get(a.policy, "#cccccc"))},'
            f" label={_q(a.name + chr(10) + policy_caption(w, a.policy))}];"
        )
    for t in w.transitions:
        label = f"{t.name}\\n{sizes_label(t.set_sizes)}" + (f"\\nmax_rounds {t.max_rounds}" if t.max_rounds else "")
        label += "".join(f"\\ntool {tc.name} = {tc.call.qualname}" for tc in t.tools)  # tools on their transition
        out.append(
            f'  {_q(t.name)} [shape=box, style=filled, fillcolor="#333333", fontcolor=white, height=0.25,'
            f' label="{label}"];'
        )
    for u, v, data in w.graph().edges(data=True):
        kind = data["kind"]
        attrs = {
            "start": "style=dotted",
            "consume": 'color="#777777"',
            "activate": "color=black",
            "route": f"style=dashed, label={_q(data.get('label', ''))}",
        }[kind]
        out.append(f"  {_q(u)} -> {_q(v)} [{attrs}];")
    out.append("}")
    return "\n".join(out) + "\n"


def to_mermaid(w: Workflow) -> str:
    """The routing graph as a Mermaid flowchart.

    >>> from srpo_graph.lang import parse, check
    >>> w = check(parse('workflow w import std policy p = "tiny" agent a { policy: p prompt: "x" }'
    ...                 ' transition t { consume: a activate: end } start: a'))
    >>> to_mermaid(w).splitlines()[0]
    'flowchart TD'
    """
    colors = policy_colors(w)
    ident = {
        n: f"n{i}" for i, n in enumerate(["start", END] + [a.name for a in w.agents] + [t.name for t in w.transitions])
    }
    out = ["flowchart TD", f"  {ident['start']}((start))", f"  {ident[END]}(((end)))"]
    for a in w.agents:
        out.append(f'  {ident[a.name]}("{a.name}<br/><small>{policy_caption(w, a.policy)}</small>")')
    for t in w.transitions:
        tools = "".join(f"<br/>tool {tc.name} = {tc.call.qualname}" for tc in t.tools)  # tools on their transition
        out.append(f'  {ident[t.name]}[["{t.name} {sizes_label(t.set_sizes)}{tools}"]]')
    for u, v, data in w.graph().edges(data=True):
        arrow = {"start": "-.->", "consume": "-->", "activate": "==>", "route": "-.->"}[data["kind"]]
        label = f"|{data['label']}|" if data["kind"] == "route" else ""
        out.append(f"  {ident[u]} {arrow}{label} {ident[v]}")
    for i, p in enumerate(w.policies):
        out.append(f"  classDef pol{i} fill:{colors[p.name]},color:#fff")
        members = [ident[a.name] for a in w.agents if a.policy == p.name]
        if members:
            out.append(f"  class {','.join(members)} pol{i}")
    out.append("  classDef trans fill:#333,color:#fff")
    if w.transitions:
        out.append(f"  class {','.join(ident[t.name] for t in w.transitions)} trans")
    return "\n".join(out) + "\n"
