"""Task files: one JSON object per line (or a dataset's rows), validated against the workflow's ``task`` block.

Runtime stage. Consumes a JSONL file and a :class:`~srpo_graph.workflow.Workflow`; produces
:class:`Task` objects. A line may carry an ``id`` (string or integer); otherwise the task is
named ``<file stem>-<line>``. Every field the workflow declares must be present with its type;
extra fields are kept (a reward may read them). Errors name the file, the line and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from srpo_graph.errors import RuntimeFailure
from srpo_graph.runtime.jsonl import iter_lines
from srpo_graph.workflow import (
    BoolType,
    ChoiceType,
    FloatType,
    IntType,
    ListType,
    RecordType,
    TextType,
    WfType,
    Workflow,
    type_str,
)


class Task(BaseModel):
    """One task: an id and its field values (``task.FIELD`` in templates)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    fields: dict[str, Any]


def type_problem(value: Any, t: WfType) -> str | None:
    """Why ``value`` is not a JSON value of ``.wf`` type ``t`` (None when it is).

    >>> type_problem(3, IntType()) is None
    True
    >>> type_problem("3", IntType())
    "expected int, got str '3'"
    """
    ok = {
        TextType: lambda v: isinstance(v, str),
        IntType: lambda v: isinstance(v, int) and not isinstance(v, bool),
        FloatType: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        BoolType: lambda v: isinstance(v, bool),
    }
    if type(t) in ok:
        if ok[type(t)](value):
            return None
        return f"expected {type_str(t)}, got {type(value).__name__} {value!r}"[:200]
    if isinstance(t, ChoiceType):
        vals = value if t.multi and isinstance(value, list) else [value]
        bad = [v for v in vals if v not in t.options]
        return None if not bad else f"expected {type_str(t)}, got {value!r}"
    if isinstance(t, ListType):
        if not isinstance(value, list):
            return f"expected {type_str(t)}, got {type(value).__name__}"
        for i, item in enumerate(value):
            p = type_problem(item, t.item)
            if p:
                return f"item {i}: {p}"
        return None
    if isinstance(t, RecordType):
        if not isinstance(value, dict):
            return f"expected {type_str(t)}, got {type(value).__name__}"
        for name, ft in t.fields:
            if name not in value:
                return f"missing record field {name!r}"
            p = type_problem(value[name], ft)
            if p:
                return f"record field {name!r}: {p}"
        return None
    return f"unknown type {t!r}"


def load_tasks(path: str | os.PathLike, workflow: Workflow | None = None) -> list[Task]:
    """Read and validate a task file.

    Args:
        path: a JSONL file, one task object per line (blank lines are skipped); or, through
            Hugging Face ``datasets`` (the optional extra ``datasets``), a ``.parquet`` file or a
            folder written by ``Dataset.save_to_disk`` (a ``DatasetDict``'s ``train`` split, or
            ``FOLDER@split``), one task per row (:mod:`srpo_graph.runtime.hf_tasks`).
        workflow: when given, every ``task`` field it declares is required and type-checked.
    Returns:
        The tasks in file order.
    Raises:
        RuntimeFailure: unreadable file, a line that is not UTF-8 or not JSON, an integer of more
            than 100 digits, nesting deeper than 64, a missing/ill-typed field or a duplicate id,
            naming ``path:line`` (``path:row N`` for a dataset) and the field.
    """
    from srpo_graph.runtime.hf_tasks import is_dataset_path, read_dataset_rows

    if is_dataset_path(path):
        dataset_rows, where = read_dataset_rows(path)
        return tasks_from_rows(dataset_rows, workflow, Path(str(path).split("@")[0]), where, unit="row")
    p = Path(path)
    # the one JSONL reader (runtime/jsonl.py): UTF-8, JSON, integer size and depth limits, file:line
    rows = iter_lines(p, RuntimeFailure, what="task file")
    return tasks_from_rows(rows, workflow, p, lambda n: f"{p}:{n}", unit="line")


def tasks_from_rows(rows: Any, workflow: Workflow | None, p: Path, where: Any, unit: str = "line") -> list[Task]:
    """Validate ``(number, object)`` rows as tasks; ``where(number)`` names a row in errors
    (``file:line`` for JSONL, ``file:row N`` for a dataset); a task without ``id`` is called
    ``<stem>-<number>``."""
    fields = dict(workflow.task_fields) if workflow is not None else {}
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, data in rows:
        if not isinstance(data, dict):
            raise RuntimeFailure.at(where(lineno), f"a task must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        raw_id = data.pop("id", None)
        if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
            raise RuntimeFailure.at(where(lineno), f"field id: must be a string or an integer, got {raw_id!r}")
        task_id = str(raw_id) if raw_id is not None else f"{p.stem}-{lineno}"
        for name, t in fields.items():
            if name not in data:
                raise RuntimeFailure.at(
                    where(lineno),
                    f"field {name}: missing (workflow {workflow.name!r} declares"  # type: ignore[union-attr]
                    f" task {{ {name}: {type_str(t)} }})",
                )
            problem = type_problem(data[name], t)
            if problem:
                raise RuntimeFailure.at(where(lineno), f"field {name}: {problem}")
        if task_id in seen:
            raise RuntimeFailure.at(where(lineno), f"field id: {task_id!r} already used on {unit} {seen[task_id]}")
        seen[task_id] = lineno
        tasks.append(Task(id=task_id, fields=data))
    if not tasks:
        raise RuntimeFailure.at(str(p), "no tasks in the file")
    return tasks
