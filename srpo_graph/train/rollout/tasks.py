"""Trainer stage, rollouts: which tasks a step trains on, and the workflow as the run uses it.

Consumes the workflow, the rollout config and task files; produces the training and held-out
task lists, a deterministic task order (a seeded permutation per pass over the tasks, indexed
by a cursor that checkpoints store), and the workflow with the run's overrides applied (model
per policy, a cap on max_tokens, greedy evaluation).

Default task file: a ``.wf`` file does not name its tasks; the trainer looks in the ``tasks/``
folder next to it for ``<stem>.jsonl``, then for the underscore-parts of the stem
(``coord_par3`` -> ``coord``, ``math_pipeline`` -> ``math``, ``coord_routed`` -> ``routed``),
and takes the first whose first line has every field the workflow's ``task`` block declares.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from srpo_graph.errors import ConfigError
from srpo_graph.runtime.seeds import task_order_seed
from srpo_graph.runtime.tasks import Task, load_tasks
from srpo_graph.workflow import Workflow


def task_file_candidates(workflow_path: str | Path) -> list[Path]:
    """Task files tried, in order, for a workflow without an explicit ``--tasks``.

    >>> [p.name for p in task_file_candidates("workflows/coord_routed.wf")]
    ['coord_routed.jsonl', 'coord.jsonl', 'routed.jsonl']
    """
    wf = Path(workflow_path)
    parts = wf.stem.split("_")
    names = [wf.stem] + [p for p in parts if p != wf.stem]
    seen: list[Path] = []
    for name in names:
        p = wf.parent / "tasks" / f"{name}.jsonl"
        if p not in seen:
            seen.append(p)
    return seen


def _fields_fit(path: Path, workflow: Workflow) -> bool:
    """Whether the first task of ``path`` has the workflow's fields.

    Raises:
        ConfigError: the first line is not readable JSON (not UTF-8, an integer too long, too
            deep...), naming ``file:line`` -- a damaged default file is reported, not skipped.
    """
    from srpo_graph.errors import RuntimeFailure
    from srpo_graph.runtime.jsonl import iter_lines

    try:
        first: Any = next((value for _, value in iter_lines(path, RuntimeFailure, what="task file")), {})
    except RuntimeFailure as exc:
        d = exc.diagnostics[0]
        raise ConfigError.at(d.where, f"the workflow's default task file: {d.message}",
                             fix="repair the line, or pass --tasks PATH") from None
    return isinstance(first, dict) and all(name in first for name, _ in workflow.task_fields)


def default_task_file(workflow_path: str | Path, workflow: Workflow) -> Path:
    """The default training task file for ``workflow_path`` (see the module docstring).

    Raises:
        ConfigError: none of the candidates exists with the workflow's fields.
    """
    candidates = task_file_candidates(workflow_path)
    for p in candidates:
        if p.is_file() and _fields_fit(p, workflow):
            return p
    fields = ", ".join(name for name, _ in workflow.task_fields) or "(none)"
    raise ConfigError.at(
        str(workflow_path),
        f"no task file found for this workflow (fields: {fields})\n"
        f"  tried: {', '.join(str(p) for p in candidates)}",
        fix="pass --tasks PATH (or rollout.tasks=PATH); `python scripts/make_data.py` generates the examples' tasks",
    )


def split_tasks(tasks: list[Any], eval_tasks: list[Any] | None, num_eval: int) -> tuple[list[Any], list[Any]]:
    """(train, eval): an explicit eval list, else the last ``num_eval`` tasks held out.

    Holding out never leaves fewer than half the tasks for training.

    >>> split_tasks(list(range(10)), None, 3)
    ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
    >>> split_tasks(list(range(4)), None, 3)
    ([0, 1], [2, 3])
    """
    if eval_tasks is not None:
        return tasks, eval_tasks
    held = min(num_eval, len(tasks) // 2)
    return (tasks[: len(tasks) - held], tasks[len(tasks) - held :]) if held else (tasks, [])


def task_indices(num_tasks: int, cursor: int, count: int, seed: int) -> list[int]:
    """Indices of the tasks of batch number ``cursor`` (``count`` distinct tasks, at most all).

    Each pass over the tasks is a permutation seeded by ``(seed, pass)`` cut into
    ``num_tasks // count`` batches (the remainder of a pass is skipped; it differs every pass),
    so a step never holds a task twice and the order depends only on the seed and the cursor
    (what a checkpoint stores).

    >>> task_indices(5, 0, 2, seed=1) == task_indices(5, 0, 2, seed=1)
    True
    >>> two = task_indices(5, 0, 2, 1) + task_indices(5, 1, 2, 1)
    >>> sorted(two)[:4] == sorted(set(two))
    True
    >>> sorted(task_indices(3, 7, 10, seed=0))
    [0, 1, 2]
    """
    count = min(count, num_tasks)
    per_pass = num_tasks // count
    p, k = divmod(cursor, per_pass)
    perm = list(range(num_tasks))
    random.Random(task_order_seed(seed, p)).shuffle(perm)
    return perm[k * count : (k + 1) * count]


def override_workflow(
    workflow: Workflow,
    *,
    models: dict[str, str] | None = None,
    max_tokens: int | None = None,
    greedy: bool = False,
    logprobs: str | None = None,
) -> Workflow:
    """The workflow with the run's overrides: model per policy (``*`` = all), a cap on
    every agent's ``max_tokens``, and temperature 0 everywhere when ``greedy``.

    Raises:
        ConfigError: ``models`` names a policy the workflow does not declare.
    """
    models = dict(models or {})
    unknown = sorted(set(models) - {p.name for p in workflow.policies} - {"*"})
    if unknown:
        raise ConfigError.at(
            "field `rollout.models`",
            f"unknown policies {unknown} in workflow {workflow.name!r}",
            fix=f"use one of {[p.name for p in workflow.policies]} or `*`",
        )
    if not models and max_tokens is None and not greedy and logprobs in (None, "full"):
        return workflow
    data = workflow.model_dump()
    for pol in data["policies"]:
        if pol.get("external") is None:  # an external policy is its endpoint, not a model to swap
            pol["model"] = models.get(pol["name"], models.get("*", pol["model"]))
    for agent in data["agents"]:
        s = agent["sampling"]
        if max_tokens is not None:
            s["max_tokens"] = min(s["max_tokens"], max_tokens)
        if greedy:
            s["temperature"] = 0.0
        if logprobs is not None:
            s["logprobs"] = logprobs
    return Workflow.model_validate(data)


def resolve_tasks(workflow_path: Path, wf: Workflow, config: Any) -> tuple[Path, list[Task], list[Task]]:
    """The run's task file and its training and held-out tasks: ``rollout.tasks`` (default: the
    workflow's, :func:`default_task_file`), ``rollout.eval_tasks`` (default: ``<stem>_eval.jsonl``
    next to it when there is one, else the last ``eval.num_tasks`` tasks).

    Raises:
        ConfigError: no training task left, or a task file that does not load.
    """
    r = config.rollout
    path = Path(r.tasks) if r.tasks is not None else default_task_file(workflow_path, wf)
    tasks = load_tasks(path, wf)
    eval_path = r.eval_tasks
    if eval_path is None and path.with_name(f"{path.stem}_eval.jsonl").is_file():
        eval_path = path.with_name(f"{path.stem}_eval.jsonl")  # make_data.py's held-out split
    eval_list = load_tasks(eval_path, wf) if eval_path is not None else None
    train_tasks, eval_tasks = split_tasks(tasks, eval_list, config.eval.num_tasks)
    if not train_tasks:
        raise ConfigError.at(str(path), "no training tasks", fix="give a task file with at least 2 tasks")
    return path, train_tasks, eval_tasks[: config.eval.num_tasks]
