"""Trainer stage: which workflow a run folder trained, so ``--resume`` with another ``.wf`` says so first.

Consumes the run folder and the loaded ``Workflow``; produces ``<run_dir>/workflow.json``
(``{"name", "file", "source_hash"}``, written when a fresh run starts) and, on ``--resume``,
one check made before anything else of the run is read (task files, checkpoints, models): a
workflow of another name is refused with "this run trained workflow 'X' (file ...)", whatever
else would have failed later (a task file whose fields the other workflow does not have, a
policy the checkpoint lacks). Runs written before this file existed are identified by their
newest checkpoint's ``state.json`` (the workflow's name only).

The same name with another source (the file was edited since) is allowed, with a note on
stderr: fixing a prompt and resuming is a legitimate thing to do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from srpo_graph.errors import ConfigError
from srpo_graph.workflow import Workflow

RUN_WORKFLOW = "workflow.json"


def record_workflow(run_dir: str | Path, workflow: Workflow, workflow_path: str | Path) -> None:
    """Write which workflow this run trains (name, resolved file, source hash), atomically."""
    path = Path(run_dir) / RUN_WORKFLOW
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"name": workflow.name, "file": str(Path(workflow_path).resolve()),
                               "source_hash": workflow.source_hash}, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def recorded_workflow(run_dir: str | Path) -> dict[str, str] | None:
    """What the run folder says it trained: ``workflow.json``, else the newest checkpoint's
    ``state.json`` (name only), else None (nothing to compare against).

    >>> recorded_workflow("/nonexistent") is None
    True
    """
    run_dir = Path(run_dir)
    try:
        got = json.loads((run_dir / RUN_WORKFLOW).read_text(encoding="utf-8"))
        if isinstance(got, dict) and isinstance(got.get("name"), str):
            return {k: str(v) for k, v in got.items()}
    except (OSError, ValueError):
        pass
    root = run_dir / "checkpoints"
    states = sorted(root.glob("step_*/state.json"), key=lambda p: int(p.parent.name.split("_")[-1])
                    if p.parent.name.split("_")[-1].isdigit() else -1) if root.is_dir() else []
    for state in reversed(states):
        try:
            name = json.loads(state.read_text(encoding="utf-8")).get("extra", {}).get("workflow")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str):
            return {"name": name}
    return None


def check_resumed_workflow(run_dir: str | Path, workflow: Workflow, workflow_path: str | Path) -> None:
    """Refuse to resume ``run_dir`` with a workflow of another name than the one it trained.

    Raises:
        ConfigError: naming the run's workflow and its file, and the one given.
    """
    got = recorded_workflow(run_dir)
    if got is None:
        return
    file = f" (file {got['file']})" if got.get("file") else ""
    if got["name"] != workflow.name:
        raise ConfigError.at(
            str(run_dir), f"this run trained workflow {got['name']!r}{file}, not {workflow.name!r} "
            f"(file {Path(workflow_path).resolve()})",
            fix=f"resume with the .wf file the run was started with: srpo-graph train "
            f"{got.get('file', '<its .wf>')} --resume {run_dir}")
    if got.get("source_hash") and workflow.source_hash and got["source_hash"] != workflow.source_hash:
        print(f"srpo-graph train: note: workflow {workflow.name!r} changed since this run started{file}; "
              "resuming with the edited file", file=sys.stderr)
