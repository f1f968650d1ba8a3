"""Trainer stage, config: the run's ``TrainConfig`` from the command line's pieces.

Consumes what ``srpo-graph train`` (and ``eval``) were given -- a ``--config`` TOML file,
``key=value`` overrides, the explicit flags, and for ``--resume`` the run folder's own
``config.toml`` -- and produces one validated :class:`~srpo_graph.train.config.schema.TrainConfig`.
Precedence, lowest first: defaults (or the resumed run's saved config), ``--config``, overrides,
flags. A resumed run's saved config that is damaged, empty or cut short is refused, never
silently replaced by defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

from srpo_graph.errors import ConfigError
from srpo_graph.train.config.loading import load_toml, merge_overrides, validate, without_objective_defaults


def build_config(config_path, overrides, *, steps=None, seed=None, run_dir=None, tasks=None, nproc=None, resume=None):
    """The run's TrainConfig from the CLI's pieces (see the module docstring for precedence).

    Raises:
        ConfigError: bad TOML, unknown field, invalid value, or a run folder without config.toml.
    """
    data: dict = {}
    source = "config"
    if resume is not None:
        saved = Path(resume) / "config.toml"
        if not saved.is_file():
            raise ConfigError.at(str(resume), "not a run folder (no config.toml)",
                                 fix="pass the --run-dir of an earlier `srpo-graph train`")
        try:
            data, source = load_toml(saved), str(saved)
        except ConfigError as exc:  # damaged: not TOML, not UTF-8
            _check_saved_config(None, saved, exc.diagnostics[0].message if exc.diagnostics
                                else str(exc).splitlines()[0].split("error: ", 1)[-1])
        _check_saved_config(data, saved)
        data = without_objective_defaults(data)  # an `objective=...` override then takes effect
    if config_path is not None:
        data = merge_overrides({**data, **load_toml(config_path)}, [])
        source = str(config_path)
    flags = list(overrides)
    for key, value in (("steps", steps), ("seed", seed), ("nproc", nproc)):
        if value is not None:
            flags.append(f"{key}={value}")
    for key, value in (("run_dir", resume if resume is not None else run_dir), ("rollout.tasks", tasks)):
        if value is not None:
            flags.append(f"{key}={json.dumps(str(value))}")
    return validate(merge_overrides(data, flags), source if not flags else f"{source} + overrides")


# what every config.toml the trainer writes holds (None fields are left out, these never are)
_SAVED_KEYS = ("steps", "seed", "run_dir", "rollout", "optim", "loss", "compile", "eval", "checkpoint", "logging")


def _check_saved_config(data: dict | None, path: Path, damage: str = "") -> None:
    """A run's config.toml that is damaged, empty or cut short must stop ``--resume``: read with
    the defaults filled in, it would silently train another run (and then overwrite the file)."""
    missing = [k for k in _SAVED_KEYS if k not in (data or {})]
    if missing:
        what = (f"is damaged ({damage})" if data is None else "is empty" if not data
                else f"is incomplete (no {', '.join(missing)})")
        copies = sorted(path.parent.glob("checkpoints/step_*/config.toml"),
                        key=lambda p: int(p.parent.name.split("_")[1]) if p.parent.name.split("_")[1].isdigit() else -1)
        fix = (f"restore it from the newest checkpoint's copy: cp {copies[-1]} {path}" if copies
               else "restore config.toml from a backup (or write the run's settings back by hand)")
        raise ConfigError.at(str(path), f"the run's saved configuration {what}",
                             why="resuming with defaults in its place would silently change the run",
                             fix=f"{fix}, then --resume again")
