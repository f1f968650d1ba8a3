"""Trainer stage: Weights & Biases logging, an optional extra that is off by default.

Consumes the flat metric records :class:`~srpo_graph.train.observe.metrics.MetricsWriter` writes and the
run's resolved config; produces a W&B run (online, or offline under ``RUN_DIR/wandb`` with
``WANDB_MODE=offline``, synced later with ``wandb sync``). Turned on with ``logging.wandb=true``
(``pip install 'srpo-graph[wandb]'``); the project, entity and run name are config fields, the
mode and the credentials W&B's own environment variables (``WANDB_MODE``, ``WANDB_API_KEY``).
The W&B run id is kept in ``RUN_DIR/wandb_id.txt``, so ``--resume`` continues the same W&B run
(W&B keeps the first value it got for a step: steps an interrupted run had logged after its last
checkpoint are not replaced). Only numbers are logged, with the same names as TensorBoard.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Mapping

from srpo_graph.errors import ConfigError

ID_FILE = "wandb_id.txt"


class WandbSink:
    """One W&B run for one run folder.

    Args:
        run_dir: the run folder (W&B files go to ``run_dir/wandb``).
        project, entity, name: the W&B project, entity (None = the default) and run name
            (None = the run folder's name).
        config: the run's resolved configuration (shown in W&B).
    Raises:
        ConfigError: ``wandb`` is not installed (naming the extra to install).
    """

    def __init__(self, run_dir: str | Path, *, project: str, entity: str | None, name: str | None,
                 config: Mapping[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ConfigError.at("field `logging.wandb`", "Weights & Biases logging needs the `wandb` package",
                                 fix="pip install 'srpo-graph[wandb]', or set logging.wandb=false") from None
        run_dir = Path(run_dir)
        id_file = run_dir / ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n", encoding="utf-8")
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(project=project, entity=entity, name=name or run_dir.name, id=run_id, resume="allow",
                              dir=str(run_dir), config=dict(config), reinit="finish_previous")

    def log(self, flat: Mapping[str, Any], step: int) -> None:
        """Log the numbers of one flat record at ``step``."""
        numbers = {k: v for k, v in flat.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()
