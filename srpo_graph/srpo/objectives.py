"""``OBJECTIVES``: the one table of named objectives (objective stage).

A named objective is a row: the :class:`~srpo_graph.srpo.options.LossConfig` options it sets
*and* the :class:`~srpo_graph.compiler.options.CompileConfig` options its advantages need
(mode, std, grouping, dynamic sampling), with its paper. Everything else is derived from
this table: :func:`loss_preset`, the trainer's ``objective=NAME`` (and ``[objective]`` in a
TOML file; explicit ``loss.*`` / ``compile.*`` settings win over the row), and the table in
docs/algorithm.md (:func:`objectives_table`, checked by a test). Adding an objective is one
row here; a new surrogate is one function in ``loss.SURROGATES``.

The single-output baselines are defined on whole episodes (GRPO's group is the G answers
of one prompt), hence ``advantage="episode"`` in their rows; on a multi-agent workflow,
``compile.advantage=transition`` turns them into "the baseline's ratio and clip with SRPO's
advantages" (docs/algorithm.md).

>>> OBJECTIVES["dapo"].loss["eps_high"], OBJECTIVES["dapo"].compile["drop_zero_variance"]
(0.28, True)
>>> OBJECTIVES["srpo"].loss_config().alpha
0.5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from srpo_graph.compiler.options import CompileConfig
from srpo_graph.errors import ConfigError
from srpo_graph.srpo.options import LossConfig


@dataclass(frozen=True)
class Objective:
    """One named objective: its loss options, its compile options, and where it comes from."""

    name: str
    title: str
    paper: str  # arXiv URL
    loss: dict[str, Any] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def loss_config(self, **overrides: Any) -> LossConfig:
        return LossConfig(**{**self.loss, **overrides})

    def compile_config(self, **overrides: Any) -> CompileConfig:
        return CompileConfig(**{**self.compile, **overrides})


def _row(o: Objective) -> tuple[str, Objective]:
    return o.name, o


OBJECTIVES: dict[str, Objective] = dict([
    _row(Objective(
        "srpo", "SRPO: one set ratio (K^-1/2), one advantage, one clip per event",
        "https://arxiv.org/abs/2609.08452",
        loss={"ratio_unit": "set", "alpha": 0.5, "member_logratio": "sum", "reduction": "event_mean"},
        compile={"advantage": "transition", "use_std": True},
        note="the paper's values where recovered; eps 0.2 is ours")),
    _row(Objective(
        "srpo_sum", "SRPO ablation: plain sum of member log-ratios (alpha = 0)",
        "https://arxiv.org/abs/2609.08452",
        loss={"ratio_unit": "set", "alpha": 0.0, "reduction": "event_mean"},
        compile={"advantage": "transition"})),
    _row(Objective(
        "srpo_mean", "SRPO ablation: mean of member log-ratios (alpha = 1)",
        "https://arxiv.org/abs/2609.08452",
        loss={"ratio_unit": "set", "alpha": 1.0, "reduction": "event_mean"},
        compile={"advantage": "transition"})),
    _row(Objective(
        "independent", "Independent members: each output its own ratio and clip, the set's advantage",
        "https://arxiv.org/abs/2609.08452",
        loss={"ratio_unit": "member", "member_logratio": "sum", "reduction": "member_mean"},
        compile={"advantage": "transition"},
        note="the SRPO paper's per-output ablation")),
    _row(Objective(
        "grpo", "GRPO: token ratio and clip, token mean per output, then mean over outputs",
        "https://arxiv.org/abs/2402.03300",
        loss={"ratio_unit": "token", "reduction": "member_mean", "eps_low": 0.2, "eps_high": 0.2},
        compile={"advantage": "episode", "use_std": True},
        note="no KL (needs a reference model); grpo_kl carries the paper's beta = 0.04")),
    _row(Objective(
        "grpo_kl", "GRPO with the paper's k3 KL to the reference policy, beta = 0.04",
        "https://arxiv.org/abs/2402.03300",
        loss={"ratio_unit": "token", "reduction": "member_mean", "kl_coef": 0.04},
        compile={"advantage": "episode", "use_std": True},
        note="loads a frozen reference model per policy")),
    _row(Objective(
        "dr_grpo", "Dr. GRPO: token ratio, no std, a constant denominator (outputs x max tokens)",
        "https://arxiv.org/abs/2503.20783",
        loss={"ratio_unit": "token", "reduction": "constant"},
        compile={"advantage": "episode", "use_std": False},
        note="D = outputs x the largest max_new_tokens of the mini-batch (TRL's B x max_completion_length)")),
    _row(Objective(
        "dapo", "DAPO: token-level mean over the batch, clip-higher, dynamic sampling",
        "https://arxiv.org/abs/2503.14476",
        loss={"ratio_unit": "token", "reduction": "token", "eps_low": 0.2, "eps_high": 0.28},
        compile={"advantage": "episode", "use_std": True, "drop_zero_variance": True},
        note="dynamic sampling here drops zero-variance groups (no re-sampling to refill the batch)")),
    _row(Objective(
        "gspo", "GSPO: length-normalized sequence ratio, one clip per output",
        "https://arxiv.org/abs/2507.18071",
        loss={"ratio_unit": "member", "member_logratio": "mean", "reduction": "member_mean",
              "eps_low": 3e-4, "eps_high": 4e-4},
        compile={"advantage": "episode", "use_std": True})),
    _row(Objective(
        "gmpo", "GMPO: geometric mean of token ratios, tokens clipped in log space",
        "https://arxiv.org/abs/2507.20673",
        loss={"ratio_unit": "member", "member_logratio": "mean", "surrogate": "gmpo", "reduction": "member_mean",
              "eps_low": 0.4, "eps_high": 0.4},
        compile={"advantage": "episode", "use_std": True},
        note="eps is in log space: token log-ratios clipped to [-0.4, 0.4]")),
    _row(Objective(
        "cispo", "CISPO: clipped, stop-gradient IS weight times the log-prob, every token kept",
        "https://arxiv.org/abs/2506.13585",
        loss={"ratio_unit": "token", "surrogate": "cispo", "reduction": "token", "eps_low": 1.0, "eps_high": 4.0},
        compile={"advantage": "episode", "use_std": True},
        note="no lower bound as in the paper; eps_high = 4 is our choice (the paper tunes it)")),
    _row(Objective(
        "dr_mas", "Dr. MAS: GRPO with agent-wise advantages (group = task x agent)",
        "https://arxiv.org/abs/2602.08847",
        loss={"ratio_unit": "token", "reduction": "member_mean"},
        compile={"advantage": "agent", "returns": "episode", "use_std": True},
        note="each output gets its trajectory's reward normalized over its agent's outputs of the task, as "
             "published; advantage=agent with provenance returns is this project's composition")),
])


def get_objective(name: str) -> Objective:
    """The row ``name``; :class:`ConfigError` naming the known ones otherwise."""
    if name not in OBJECTIVES:
        import difflib

        near = difflib.get_close_matches(name, list(OBJECTIVES), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError.at("field `objective`", f"unknown objective {name!r}",
                             fix=f"{hint}known: {', '.join(OBJECTIVES)} (docs/algorithm.md)")
    return OBJECTIVES[name]


def loss_preset(name: str, **overrides: Any) -> LossConfig:
    """The loss options of the named objective (its paper, its compile options and the docs'
    table are in its row too), ``overrides`` on top.

    Raises:
        ConfigError: an unknown name, naming the known ones.

    >>> loss_preset("dapo").eps_high
    0.28
    """
    return get_objective(name).loss_config(**overrides)


def _fmt(value: Any) -> str:
    return str(getattr(value, "value", value))


def objectives_table() -> str:
    """The markdown table of docs/algorithm.md, generated from ``OBJECTIVES``.

    >>> objectives_table().splitlines()[0].startswith("| objective |")
    True
    """
    rows = ["| objective | what | ratio unit | member log-ratio | α | surrogate | reduction | ε_low / ε_high "
            "| KL β | advantage (compile) | paper |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in OBJECTIVES.values():
        lc, cc = o.loss_config(), o.compile_config()
        unit = _fmt(lc.ratio_unit)
        alpha = f"{lc.alpha:g}" if unit == "set" else "—"
        mlr = _fmt(lc.member_logratio) if unit != "token" else "—"
        adv = [_fmt(cc.advantage), "std" if cc.use_std else "no std"]
        if cc.drop_zero_variance:
            adv.append("drop zero-variance groups")
        if cc.grouping.value != "pooled":
            adv.append(f"grouping {cc.grouping.value}")
        what = o.title.split(": ", 1)[-1] + (f" ({o.note})" if o.note else "")
        rows.append(f"| `{o.name}` | {what} | `{unit}` | {mlr} | {alpha} | `{_fmt(lc.surrogate)}` | "
                    f"`{_fmt(lc.reduction)}` | {lc.eps_low:g} / {lc.eps_high:g} | {lc.kl_coef:g} | "
                    f"{', '.join(adv)} | [{o.paper.rsplit('/', 1)[-1]}]({o.paper}) |")
    return "\n".join(rows)
