"""Trainer stage: the training configuration (``TrainConfig``), loaded from TOML and overrides.

Consumes a TOML file (optional), ``key=value`` dotted overrides and CLI flags; produces a frozen,
validated :class:`TrainConfig`. Every field says its unit and valid range. Invalid input raises
:class:`~srpo_graph.errors.ConfigError` naming the field (what, why, fix), never a raw pydantic
``ValidationError``. The resolved config is written to ``RUN_DIR/config.toml`` so a run can be
read back and resumed.

The schema (the sections, their fields and validators) is ``schema.py``'s; this module
loads, checks, overrides and writes it. It knows nothing about models or rollouts.

>>> cfg = TrainConfig()
>>> cfg.rollout.samples, cfg.rollout.tasks_per_step, cfg.optim.lr
(8, 16, 0.001)
>>> apply_overrides(cfg, ["optim.lr=3e-4", "steps=5"]).optim.lr
0.0003
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import tomllib
from pydantic import BaseModel, ValidationError

from srpo_graph.errors import ConfigError, Diagnostic, render
from srpo_graph.srpo.objectives import OBJECTIVES
from srpo_graph.train.config.schema import TrainConfig

# --------------------------------------------------------------------------- loading


def _field_doc(loc: Sequence[Any]) -> str | None:
    model: Any = TrainConfig
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            break
        info = fields[part]
        model = info.annotation
    return info.description if info is not None else None


def _nearest_field(loc: Sequence[Any]) -> str | None:
    """The known field closest in spelling to an unknown one (same section first, then anywhere).

    >>> _nearest_field(["optim", "lrr"]), _nearest_field(["optimm"]), _nearest_field(["lr"])
    ('optim.lr', 'optim', 'optim.lr')
    """
    import difflib

    names = [part for part in loc if isinstance(part, str)]
    model: Any = TrainConfig
    for part in names[:-1]:
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return None
        model = info.annotation
    here = list(getattr(model, "model_fields", {}))
    prefix = ".".join(names[:-1] + [""]) if len(names) > 1 else ""
    hit = difflib.get_close_matches(names[-1], here, n=1, cutoff=0.6)
    if hit:
        return prefix + hit[0]
    everywhere = [row.split("`")[1] for row in config_reference().splitlines()[2:]]
    hit = difflib.get_close_matches(names[-1], [f.rsplit(".", 1)[-1] for f in everywhere], n=1, cutoff=0.8)
    return next((f for f in everywhere if f.rsplit(".", 1)[-1] == hit[0]), None) if hit else None


def _config_error(exc: ValidationError, source: str) -> ConfigError:
    diags = []
    for e in exc.errors():
        loc = list(e["loc"])
        name = ".".join(str(p) for p in loc) or "<config>"
        what = f"field `{name}`: {e['msg']}"
        if e["type"] == "extra_forbidden":
            what = f"unknown field `{name}`"
            near = _nearest_field(loc)
            fix = (f"did you mean `{near}`? " if near else "remove it or check its spelling ") + \
                "(see docs/training.md for every field)"
        else:
            doc = _field_doc([p for p in loc if isinstance(p, str)])
            fix = doc or "see docs/training.md"
            if "input" in e and not isinstance(e["input"], dict):
                what += f" (got {e['input']!r})"
        diags.append(Diagnostic(what, hint=fix, where=source))
    return ConfigError(render(diags, limit=5), diagnostics=diags)  # the first 5, then "... and N more"


def validate(data: dict[str, Any], source: str = "<config>") -> TrainConfig:
    """Build a :class:`TrainConfig` from nested plain data.

    Raises:
        ConfigError: naming the field, why it is wrong and how to fix it.

    >>> validate({"optim": {"lr": -1}})
    Traceback (most recent call last):
    ...
    srpo_graph.errors.ConfigError: <config>: error: field `optim.lr`: Input should be greater than 0 (got -1)
      fix: Peak learning rate, (0, 1]. ...
    """
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, source) from None
    check_trainable(config, source)
    refuse_filled_by_trainer(config, source)
    return config


def without_objective_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the loss/compile values that only restate its objective's row (or the defaults)
    removed, so a new ``objective=...`` override takes effect instead of being outvoted by them."""
    name = (data.get("objective") or {}).get("name", "srpo")
    row = OBJECTIVES.get(name)
    if row is None:
        return data
    out = dict(data)
    for section, base in (("loss", to_data(row.loss_config())), ("compile", to_data(row.compile_config()))):
        given = out.get(section)
        if isinstance(given, dict):
            out[section] = {k: v for k, v in given.items() if base.get(k, object()) != v}
    return out


# smallest normal number of each weight dtype (torch.finfo(dtype).tiny; no torch import here)
_DTYPE_TINY = {"float32": 1.1754943508222875e-38, "bfloat16": 1.1754943508222875e-38, "float16": 6.103515625e-05}


def check_trainable(config: "TrainConfig", source: str = "<config>") -> None:
    """Reject combinations that validate field by field but cannot train (issue 12, item 8).

    * ``rollout.dtype = "float16"``: the trainer has no loss scaler, and AdamW on float16 weights
      underflows its second moment and eps to 0 (NaN weights after one update);
    * ``optim.eps`` below the weight dtype's smallest normal number: it rounds to 0 (or a
      denormal) in Adam's denominator, which then divides by zero.

    Raises:
        ConfigError: naming the field, why and the fix.

    >>> check_trainable(TrainConfig(optim={"eps": 1e-46}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    srpo_graph.errors.ConfigError: <config>: error: field `optim.eps`: 1e-46 is below the smallest normal float32 ...
      why: Adam divides by sqrt(v) + eps; an eps that rounds to 0 gives inf/NaN weights
      fix: use optim.eps >= 1.18e-38 (the usual 1e-8 is safe for float32 and bfloat16)
    """
    dtype = config.rollout.dtype
    if dtype == "float16":
        raise ConfigError.at(
            source,
            "field `rollout.dtype`: float16 cannot be trained here (no loss scaler)",
            why="AdamW on float16 weights underflows to 0 and gives NaN weights after one update",
            fix='use rollout.dtype="bfloat16" (same memory, float32\'s range) or "float32"',
        )
    tiny = _DTYPE_TINY[dtype]
    if config.optim.eps < tiny:
        raise ConfigError.at(
            source,
            f"field `optim.eps`: {config.optim.eps:g} is below the smallest normal {dtype} number ({tiny:.3g})",
            why="Adam divides by sqrt(v) + eps; an eps that rounds to 0 gives inf/NaN weights",
            fix=f"use optim.eps >= {tiny:.3g} (the usual 1e-8 is safe for float32 and bfloat16)",
        )


# CompileConfig fields the trainer fills from the workflow (compiler/options.py); a value in a
# config would be overwritten, so one given is refused (issue 39, item 6: every accepted setting acts)
FILLED_BY_TRAINER = {
    "frozen_policies": "the policies declared `frozen` (or `openai(...)`) in the .wf",
    "policies": "the workflow's policies, in declaration order",
}


def refuse_filled_by_trainer(config: "TrainConfig", source: str = "<config>") -> None:
    """Refuse ``compile.frozen_policies`` / ``compile.policies`` given in a training config.

    Raises:
        ConfigError: naming the field, what fills it and the fix.

    >>> refuse_filled_by_trainer(TrainConfig(compile={"frozen_policies": []}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    srpo_graph.errors.ConfigError: <config>: error: field `compile.frozen_policies`: is not a setting ...
    """
    for name in sorted(FILLED_BY_TRAINER.keys() & config.compile.model_fields_set):
        fix = ("remove it; to train a frozen policy, remove `frozen` from its declaration in the .wf; to freeze one, "
               "add `frozen`" if name == "frozen_policies" else "remove it (policy ids follow the workflow)")
        raise ConfigError.at(source, f"field `compile.{name}`: is not a setting of a training run: the trainer "
                             f"fills it from the workflow ({FILLED_BY_TRAINER[name]}), so a value here would be "
                             "ignored", fix=fix)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file into plain data; :class:`ConfigError` with line/column if it does not parse."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError.at(
            str(p), f"cannot read config file: {exc.strerror}", fix="check the --config path"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError.at(
            str(p), f"not valid TOML: not UTF-8 text (byte {exc.start})", fix="a TOML file is UTF-8 text"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError.at(str(p), f"not valid TOML: {exc}", fix="see https://toml.io for the syntax") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b=value``; the value is read as a TOML value (a bare word is a string).

    >>> parse_override("optim.lr=3e-4")
    (['optim', 'lr'], 0.0003)
    >>> parse_override("rollout.backend=sglang")
    (['rollout', 'backend'], 'sglang')
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError.at(f"override {item!r}", "expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word: take it as a string (paths, enum names)
    return key.split("."), value


def merge_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides to nested plain data (a copy)."""
    out = _deep_copy(data)
    for item in overrides:
        keys, value = parse_override(item)
        node = out
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise ConfigError.at(f"override {item!r}", f"`{k}` is a value, not a section")
            node = child
        node[keys[-1]] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    return data


def apply_overrides(config: TrainConfig, overrides: Sequence[str]) -> TrainConfig:
    """A new config with ``key=value`` overrides applied and validated.

    >>> apply_overrides(TrainConfig(), ["objective=gspo"]).loss.eps_high
    0.0004
    """
    return validate(merge_overrides(without_objective_defaults(to_data(config)), overrides), "override")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """TOML file (optional) + overrides -> validated :class:`TrainConfig`.

    Raises:
        ConfigError: unreadable or invalid TOML, unknown or invalid field.
    """
    data = load_toml(path) if path is not None else {}
    data = merge_overrides(data, overrides)
    return validate(
        data, str(path) if path is not None and not overrides else ("config" if path is None else f"{path} + overrides")
    )


def to_data(config: BaseModel) -> dict[str, Any]:
    """Plain TOML-able data (paths as strings, tuples as lists, None dropped). A TrainConfig's
    ``compile`` fields that the trainer fills from the workflow (``FILLED_BY_TRAINER``) are left out:
    they are no setting, and data that held them would be refused when read back (``--resume``,
    the config file ``--nproc`` hands its ranks, rank 0's config under torchrun).

    >>> "frozen_policies" in to_data(TrainConfig())["compile"]
    False
    """
    data = _drop_none(config.model_dump(mode="json"))
    if isinstance(config, TrainConfig) and isinstance(data.get("compile"), dict):
        data["compile"] = {k: v for k, v in data["compile"].items() if k not in FILLED_BY_TRAINER}
    return data


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def write_config(config: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as TOML (what ``--resume`` reads back), atomically."""
    import os

    import tomli_w

    # atomic: a crash or a full disk leaves the old file or the new one, never a cut-off one
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(tomli_w.dumps(to_data(config)))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk: name the file (a failed write or fsync names none)
        tmp.unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def config_reference() -> str:
    """A markdown table of every field (section, name, default, meaning): docs/training.md's reference.

    >>> "| `optim.lr` | `0.001` |" in config_reference()
    True
    """
    rows = ["| field | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = info.get_default(call_default_factory=True)
            default = getattr(default, "value", default)
            desc = (info.description or "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{prefix}{name}` | `{default if default is not None else 'None'}` | {desc} |")

    walk(TrainConfig, "")
    return "\n".join(rows)


def default_run_dir(workflow_name: str, root: Path = Path("runs")) -> Path:
    """A new, unused run folder ``runs/<workflow name>-<YYYYmmdd-HHMMSS>`` (never an old run's)."""
    import time

    base = root / f"{workflow_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
