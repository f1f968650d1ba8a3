"""Readable views of trace episodes: a rich console rendering and a self-contained HTML page.

Runtime stage. Consumes :class:`~srpo_graph.runtime.trace.Episode` objects; produces text for a
terminal or an HTML document (with the workflow, each episode is also drawn on its graph). Events are shown in order:
each output (agent, policy, step,
the prompt it was given -- its prompt ids decoded with its policy's tokenizer, so a template's
``{ref?}`` holes appear filled in, and a chat prompt as its conversation, one line per turn with
its role (:func:`conversation`: ChatML and Llama 3 markers) --,
text, extracted value, tokens, summed log-prob) and each transition (the outputs it consumed --
its active set --, tool results, reward, what it activated).

The prompt is decoded from the ids recorded (never re-rendered from the template), by a
:class:`PromptDecoder` given ``{policy: model}``; a policy whose tokenizer is not on this machine
shows its prompt as a count of ids.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any, Callable, Mapping, Sequence

from srpo_graph.runtime.trace import Episode, Output
from srpo_graph.workflow import Workflow

Decoder = Callable[[Output], "str | None"]  # an output's decoded prompt, or None (no tokenizer)

_STATUS_COLOR = {"ok": "green", "truncated": "yellow", "failed": "red"}


def _short(value: Any, limit: int = 160) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    s = s.replace("\n", "⏎")
    return s if len(s) <= limit else s[: limit - 1] + "…"


class PromptDecoder:
    """Decodes an output's ``prompt_ids`` with its policy's tokenizer, each loaded once (locally only).

    Args:
        models: ``{policy: model}`` (a ``.wf``'s ``policy`` declarations, or ``--model``); a
            policy absent from it, or whose tokenizer is not on this machine, decodes to None.
    """

    def __init__(self, models: Mapping[str, str]):
        self.models = dict(models)
        self._tokenizers: dict[str, Any] = {}
        self.missing: set[str] = set()  # policies seen without a tokenizer

    def __call__(self, o: Output) -> str | None:
        if o.policy not in self._tokenizers:
            from srpo_graph.runtime.tokens import cached_tokenizer

            model = self.models.get(o.policy)
            self._tokenizers[o.policy] = cached_tokenizer(model) if model is not None else None
        tok = self._tokenizers[o.policy]
        if tok is None:
            self.missing.add(o.policy)
            return None
        return tok.decode(o.prompt_ids, skip_special_tokens=False)


# a chat template's turns in a decoded prompt: ChatML (Qwen) and Llama 3 headers
_TURN = re.compile(
    r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)"
    r"|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|$)",
    re.S,
)


def conversation(prompt: str) -> list[tuple[str, str]] | None:
    """The (role, content) turns of a decoded chat prompt, or None when it holds no chat turns.
    The last turn is the open assistant turn the output completed (its content empty).

    >>> conversation("<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nhi<|im_end|>\\n"
    ...              "<|im_start|>assistant\\n")
    [('system', 'Be brief.'), ('user', 'hi'), ('assistant', '')]
    >>> conversation("<q>7<s>") is None
    True
    """
    turns = [(m.group(1) or m.group(3), m.group(2) if m.group(1) else m.group(4)) for m in _TURN.finditer(prompt)]
    return turns or None


def _conversation_lines(prompt: str) -> str | None:
    turns = conversation(prompt)
    if turns is None:
        return None
    return "\n".join(f"{role:>9} │ {content}" for role, content in turns if content or role != "assistant")


def _message_lines(messages: Sequence[Any]) -> str:
    """The messages sent to an external agent (``Output.messages``), one line per message."""
    return "\n".join(f"{m.role:>9} │ {m.content.replace(chr(10), '⏎')}" for m in messages)


def timeline(ep: Episode) -> list[tuple[str, Any]]:
    """Outputs and transitions interleaved in the order they happened (by step).

    Returns:
        ``("output", Output)`` and ``("transition", TransitionRecord)`` pairs.
    """
    events: list[tuple[int, int, int, str, Any]] = []
    for i, o in enumerate(ep.outputs):
        events.append((o.step, 0, i, "output", o))
    for i, t in enumerate(ep.transitions):
        events.append((t.step, 1, i, "transition", t))
    return [(kind, obj) for *_, kind, obj in sorted(events, key=lambda e: e[:3])]


def print_episode(console: Any, ep: Episode, index: int | None = None, decode: Decoder | None = None) -> None:
    """Print one episode with rich; with ``decode``, each output's prompt too (None = hidden).

    Every text that comes from a trace (outputs, prompts, values, names, tool results, errors) is a
    plain ``rich.text.Text`` span, never markup: ``[bold]`` in an output prints as written, and a
    trailing backslash stays one backslash (markup escaping doubled it).
    """
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    outs = {o.id: o for o in ep.outputs}
    table = Table(show_header=True, header_style="bold", expand=True, box=None)
    table.add_column("step", justify="right", width=4)
    table.add_column("event", width=18)
    table.add_column("details", ratio=1)
    for kind, obj in timeline(ep):
        if kind == "output":
            lp = sum(obj.logprobs)
            details = Text.assemble((f"{obj.policy} v{obj.policy_version}, {len(obj.prompt_ids)}+"
                                     f"{len(obj.completion_ids)} tok, logp {lp:.2f}, {obj.finish_reason}", "dim"), "\n")
            if decode is not None and obj.messages is not None:  # an external agent: the messages it was sent
                details.append_text(Text.assemble(("conversation", "blue"), "\n", _message_lines(obj.messages), "\n",
                                                  ("assistant", "blue"), (" │ ", "dim")))
            elif decode is not None:
                text = decode(obj)
                chat = None if text is None else _conversation_lines(text)
                if text is None:
                    details.append(f"prompt ({len(obj.prompt_ids)} ids, no local tokenizer for {obj.policy})\n",
                                   style="dim")
                elif chat is not None:
                    details.append_text(Text.assemble(("conversation", "blue"), "\n", chat, "\n", ("assistant", "blue"),
                                                      (" │ ", "dim")))
                else:
                    details.append_text(Text.assemble(("prompt", "blue"), (" │ ", "dim"), text, "\n",
                                                      ("output", "blue"), (" │ ", "dim")))
            details.append_text(Text.assemble(_short(obj.text), " ", (f"→ {_short(obj.value)}", "magenta")))
            table.add_row(str(obj.step), Text.assemble((obj.id, "cyan"), " ", (obj.agent, "bold")), details)
        else:
            members = ", ".join(f"{c} ({outs[c].agent})" if c in outs else c for c in obj.consumed)
            lines = Text(f"consumed {{{members}}}  (set size {len(obj.consumed)}) → activates "
                         f"{', '.join(obj.activated)}")
            for name, value in (obj.tool_results or {}).items():
                lines.append_text(Text.assemble("\n", (f"tool {name}", "blue"), f" = {_short(value)}"))
            if obj.reward is not None:
                lines.append(f"\nreward {obj.reward:g}", style="green")
            table.add_row(str(obj.step), Text.assemble((obj.id, "yellow"), " ", (obj.name, "bold")), lines)
    color = _STATUS_COLOR[ep.status]
    title = Text.assemble(f"{'#' + str(index) + ' ' if index is not None else ''}{ep.workflow.name} · task "
                          f"{ep.task_id} · sample {ep.sample} · ", (ep.status, color), f" · reward {ep.reward:g}")
    body: Any = table
    if ep.error:
        body = Group(table, Text(f"error: {ep.error}", style="red"))
    console.print(Panel(body, title=title, title_align="left"))


def episode_html(
    episodes: Sequence[Episode],
    title: str = "srpo-graph traces",
    workflow: Workflow | None = None,
    decode: Decoder | None = None,
) -> str:
    """A self-contained HTML page showing each episode as an event timeline.

    Args:
        episodes: the episodes to show.
        title: the page title.
        workflow: when given, each episode is also drawn on its routing graph
            (:func:`~srpo_graph.runtime.episode_view.episode_svg`), next to its timeline.
        decode: when given, each output's decoded prompt is shown (a folded block, open).
    Returns:
        The HTML text.

    >>> "<html" in episode_html([])
    True
    """
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;width:100%;margin-bottom:2em}"
        "td,th{border-bottom:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}"
        ".out{background:#f4f8ff}.tr{background:#fffbea}.ok{color:#080}.truncated{color:#a60}.failed{color:#c00}"
        "code{white-space:pre-wrap}.dim{color:#777;font-size:90%}"
        ".prompt{margin-bottom:4px}.prompt code{display:block;background:#fff;border-left:3px solid #9bd;padding:2px "
        "6px}"
        ".row{display:flex;gap:2em;align-items:flex-start}.row table{flex:1}.graph{flex:none}",
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for ep in episodes:
        outs = {o.id: o for o in ep.outputs}
        parts.append(
            f"<h2>{html.escape(ep.workflow.name)} · task {html.escape(ep.task_id)} · sample {ep.sample} · "
            f"<span class='{ep.status}'>{ep.status}</span> · reward {ep.reward:g}</h2>"
        )
        if ep.error:
            parts.append(f"<p class='failed'>error: {html.escape(ep.error)}</p>")
        parts.append("<div class='row'>")
        if workflow is not None:
            from srpo_graph.runtime.episode_view import episode_svg

            stale = (
                ""
                if ep.workflow.hash == workflow.source_hash
                else ("<p class='dim'>the .wf file changed since this episode was recorded (hash differs)</p>")
            )
            parts.append(f"<div class='graph'>{episode_svg(workflow, ep)}{stale}</div>")
        parts.append("<table><tr><th>step</th><th>event</th><th>details</th></tr>")
        for kind, obj in timeline(ep):
            if kind == "output":
                prompt = ""
                if decode is not None and obj.messages is not None:  # an external agent's messages
                    prompt = ("<details class='prompt' open><summary>conversation</summary>"
                              f"<code>{html.escape(_message_lines(obj.messages))}</code></details>")
                elif decode is not None:
                    text = decode(obj)
                    chat = None if text is None else _conversation_lines(text)
                    prompt = (
                        f"<div class='dim'>prompt: {len(obj.prompt_ids)} ids (no local tokenizer for policy "
                        f"{html.escape(obj.policy)})</div>"
                        if text is None
                        else f"<details class='prompt' open><summary>{'conversation' if chat else 'prompt'}</summary>"
                        f"<code>{html.escape(chat or text)}</code></details>"
                    )
                parts.append(
                    f"<tr class='out'><td>{obj.step}</td><td>{obj.id} <b>{html.escape(obj.agent)}</b></td><td>{prompt}"
                    f"<code>{html.escape(obj.text)}</code> → <b>{html.escape(_short(obj.value))}</b>"
                    f"<div class='dim'>{html.escape(obj.policy)} v{obj.policy_version} · {len(obj.prompt_ids)} prompt"
                    f" + {len(obj.completion_ids)} completion tokens · logp {sum(obj.logprobs):.3f} ·"
                    f" {obj.finish_reason}</div></td></tr>"
                )
            else:
                members = ", ".join(f"{c} ({html.escape(outs[c].agent)})" if c in outs else c for c in obj.consumed)
                extra = "".join(
                    f"<div>tool <b>{html.escape(k)}</b> = <code>{html.escape(_short(v, 400))}</code></div>"
                    for k, v in (obj.tool_results or {}).items()
                )
                if obj.reward is not None:
                    extra += f"<div class='ok'>reward {obj.reward:g}</div>"
                parts.append(
                    f"<tr class='tr'><td>{obj.step}</td><td>{obj.id} <b>{html.escape(obj.name)}</b></td>"
                    f"<td>active set {{{members}}} → {html.escape(', '.join(obj.activated))}{extra}</td></tr>"
                )
        parts.append("</table></div>")
    parts.append("</body></html>")
    return "\n".join(parts)
