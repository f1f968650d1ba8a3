"""The combination matrix (issue 36 item 6): which pairs of features train together, which are refused.

ONE table. ``FEATURES`` holds a row per feature: what it adds to a run (a part of the composed
workflow, config overrides, a process count) and what a run with it must preserve. ``OUTCOMES``
holds every pair that does not simply work: refused (the substring of the ConfigError that names
both features, raised at config/check time, before anything trains), or the same run as one
feature alone (``implied``), or two values of one setting (``exclusive``). Every other pair works,
and tests/test_combinations.py trains it (2 steps, tiny models) and checks what each feature must
preserve. docs/combinations.md is generated from this table (scripts/gen_docs.py,
tests/test_docs_generated.py).

A new feature adds a row to ``FEATURES`` (and its refusals to ``OUTCOMES``), not a file.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Feature:
    """One feature of a training run.

    Attributes:
        key: short name (test ids, ``OUTCOMES`` keys).
        name: as the docs name it.
        parts: parts of the composed workflow it switches on (``workflow_text``).
        overrides: ``key=value`` config overrides; a later feature's value of the same key wins.
        nproc: processes (``--nproc``).
        needs_sglang: it needs a real SGLang server (test marked ``sglang``).
        preserves: what a run with it must keep (the check the test makes).
    """

    key: str
    name: str
    preserves: str
    parts: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    nproc: int = 1
    needs_sglang: bool = False


SGLANG = ("rollout.backend=\"sglang\"", "rollout.sglang.launch=\"cpu\"")  # a server this run starts
FEATURES: tuple[Feature, ...] = (
    Feature("chat", "chat agents (`memory: chat`)", "the trained token ids are the sampled ones",
            parts=("chat",)),
    Feature("frozen", "frozen policies", "frozen weights unchanged: no optimizer, not in checkpoints, sampled at "
            "version 0", parts=("frozen",)),
    Feature("external", "external (openai) policies", "the endpoint's outputs are in the traces, never trained",
            parts=("external",)),
    Feature("lora", "LoRA roles", "only the adapters are saved (the base: a pointer)", parts=("lora",)),
    Feature("routers", "routers and loops", "the trained token ids are the sampled ones", parts=("routers",)),
    Feature("ddp", "`--nproc 2` (ddp)", "every metric equals one process's", nproc=2),
    Feature("fsdp", "`--nproc 2` (fsdp)", "every metric equals one process's", overrides=("strategy=\"fsdp\"",),
            nproc=2),
    Feature("every_rank", "every-rank rollouts (`rollout.every_rank`)", "every metric equals one process's",
            overrides=("rollout.every_rank=true",), nproc=2),
    Feature("worker", "rollout worker (`rollout.worker`)", "the trained token ids are the sampled ones",
            overrides=("rollout.worker=true",)),
    Feature("stale", "overlapped rollouts (`rollout.max_staleness = 1`)", "staleness <= 1 on every output",
            overrides=("rollout.max_staleness=1", "rollout.worker=true")),
    Feature("partial", "partial rollouts (`rollout.partial_rollouts`)", "staleness <= 1 on every output",
            overrides=("rollout.max_staleness=1", "rollout.partial_rollouts=true", *SGLANG), needs_sglang=True),
    Feature("sglang", "SGLang backend (vs transformers)", "the trained token ids are the sampled ones",
            overrides=SGLANG, needs_sglang=True),
    Feature("resume", "resume (`--resume`)", "1 step + resume to 2 = 2 steps straight (metrics, traces)"),
    Feature("eval", "eval (`eval.every`)", "held-out metrics on every step", overrides=("eval.every=1",)),
)
BY_KEY = {f.key: f for f in FEATURES}

# Every pair that does not simply work. "refused: S": a ConfigError containing S, before any training
# step (for --nproc pairs before torchrun starts). "implied: K": the pair is feature K's run (one
# switches the other on). "exclusive": two values of one setting.
TORCHRUN_STALE = "are not supported under torchrun yet"
OUTCOMES: dict[frozenset[str], str] = {
    frozenset(pair): outcome
    for pair, outcome in {
        ("ddp", "fsdp"): "exclusive: `strategy` is one of them",
        ("fsdp", "lora"): "refused: do not run under fsdp",
        ("ddp", "every_rank"): "implied: every_rank",
        ("every_rank", "fsdp"): 'refused: strategy = "fsdp" samples on rank 0 only',
        ("every_rank", "worker"): "refused: with rollout.worker = true, rank 0's rollout worker process samples",
        ("every_rank", "sglang"): "refused: is a server: rank 0 alone sends it requests",
        ("ddp", "stale"): f"refused: {TORCHRUN_STALE}",
        ("fsdp", "stale"): f"refused: {TORCHRUN_STALE}",
        ("every_rank", "stale"): f"refused: {TORCHRUN_STALE}",
        ("ddp", "partial"): f"refused: and partial rollouts {TORCHRUN_STALE}",
        ("fsdp", "partial"): f"refused: and partial rollouts {TORCHRUN_STALE}",
        ("every_rank", "partial"): f"refused: and partial rollouts {TORCHRUN_STALE}",
        ("worker", "stale"): "implied: stale",
        ("partial", "sglang"): "implied: partial",
        ("partial", "stale"): "implied: partial",
        ("partial", "worker"): "refused: rollout.worker runs the transformers backend in a process of its own",
        ("sglang", "worker"): "refused: rollout.worker runs the transformers backend in a process of its own",
    }.items()
}


def outcome(a: str, b: str) -> str:
    """``works``, ``refused: ...``, ``implied: ...`` or ``exclusive: ...`` for the pair ``a``, ``b``."""
    return OUTCOMES.get(frozenset((a, b)), "works")


def pairs() -> list[tuple[str, str]]:
    """Every unordered pair of features, in table order."""
    return [(a.key, b.key) for a, b in itertools.combinations(FEATURES, 2)]


def overrides(keys: tuple[str, ...]) -> list[str]:
    """The merged overrides of ``keys`` (a later feature's value of a key wins). Overlapped rollouts
    sample in a rollout worker on transformers, in the server on sglang (no worker unless asked)."""
    merged: dict[str, str] = {}
    for f in (BY_KEY[k] for k in keys):
        for item in f.overrides:
            name, value = item.split("=", 1)
            merged[name] = value
    if merged.get("rollout.backend") == '"sglang"' and "worker" not in keys:
        merged.pop("rollout.worker", None)
    return [f"{k}={v}" for k, v in merged.items()]


def nproc(keys: tuple[str, ...]) -> int:
    return max((BY_KEY[k].nproc for k in keys), default=1)  # () : the plain run, one process


def workflow_text(keys: tuple[str, ...], url: str = "http://127.0.0.1:9/v1") -> str:
    """The workflow a run of ``keys`` trains: two digit agents ``a``, ``b`` in one set (or routed to by
    ``r``), on ``tiny`` (``qwen3-test`` with chat agents); frozen makes ``b``'s policy frozen, LoRA
    puts the trained agents on adapters, external adds a third agent ``c`` behind ``url``."""
    parts = {p for k in keys for p in BY_KEY[k].parts}
    model = "qwen3-test" if "chat" in parts else "tiny"
    digits = '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'
    policy_a = "role_a" if "lora" in parts else "m"
    policy_b = "past" if "frozen" in parts else ("role_b" if "lora" in parts else "m")
    agents = ["a", "b"] + (["c"] if "external" in parts else [])
    routed = "routers" in parts
    uses_m = routed or "m" in (policy_a, policy_b)
    lines = ["workflow combo", "import std", "task { target: int }"]
    if uses_m:
        lines.append(f'policy m = "{model}"')
    if "lora" in parts:
        lines += [f'policy base = "{model}"',
                  'policy role_a = lora("base", r=4, alpha=8, targets=[q_proj, v_proj])',
                  'policy role_b = lora("base", r=4, alpha=8, targets=[q_proj, v_proj])']
    if "frozen" in parts:
        lines.append(f'policy past = "{model}" frozen')
    if "external" in parts:
        lines.append(f'policy judge = openai("{url}", model="default", timeout=30, retries=0)')
    chat = '  system: "Write one digit."\n  memory: chat\n' if "chat" in parts else ""
    for name, policy in (("a", policy_a), ("b", policy_b)):
        lines.append(f'agent {name} {{\n  policy: {policy}\n{chat if name == "a" else ""}'
                     f'  prompt: "<{name}>{{task.target}}"\n'
                     f'  sample {{ temperature: 1.0, max_tokens: 1, allow: {digits} }}\n'
                     f'  output: int via std.digit\n}}')
    if "external" in parts:
        lines.append('agent c {\n  policy: judge\n  prompt: "<c>{task.target}"\n  sample { max_tokens: 4 }\n'
                     '  output: text via std.text\n}')
    if routed:
        allow = ", ".join(f'"{i}"' for i in range(len(agents)))
        lines.append(f'agent r {{\n  policy: m\n  prompt: "<r>{{task.target}}"\n'
                     f'  sample {{ temperature: 1.0, max_tokens: 1, allow: [{allow}] }}\n'
                     f'  output: choice[{", ".join(agents)}] via std.digit_choice\n}}')
        lines.append("transition dispatch {\n  consume: r\n  activate: route r\n}")
        for name in agents:
            reward = f"  reward: std.equals({name}, task.target)\n" if name != "c" else ""
            lines.append(f"transition done_{name} {{\n  consume: {name}\n{reward}  activate: end\n}}")
        lines += ["start: r", "max_steps: 3"]
    else:
        lines.append(f"transition joint {{\n  consume: {', '.join(agents)}\n  activate: end\n}}")
        lines += [f"start: {', '.join(agents)}", "reward: std.digits_sum_to(task.target, a, b)"]
    return "\n".join(lines) + "\n"


def write_tasks(path: Path, num: int = 12) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "target": i % 10}) + "\n" for i in range(num)))
    return path


def doc_table() -> str:
    """The matrix as markdown (docs/combinations.md): one row and one column per feature."""
    short = {"works": "works", "refused": "refused", "implied": "same run", "exclusive": "-"}
    keys = [f.key for f in FEATURES]
    head = "| | " + " | ".join(f"`{k}`" for k in keys) + " |"
    rows = [head, "|---" * (len(keys) + 1) + "|"]
    for a in FEATURES:
        cells = ["·" if a.key == b else short[outcome(a.key, b).split(":")[0]] for b in keys]
        rows.append(f"| `{a.key}` | " + " | ".join(cells) + " |")
    legend = ["", "| feature | what it is | a run with it must preserve |", "|---|---|---|"]
    legend += [f"| `{f.key}` | {f.name} | {f.preserves} |" for f in FEATURES]
    notes = ["", "| pair | outcome |", "|---|---|"]
    notes += [f"| `{a}` + `{b}` | {outcome(a, b)} |" for a, b in pairs() if outcome(a, b) != "works"]
    return "\n".join(rows + legend + notes)
