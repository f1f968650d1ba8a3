"""Trainer stage, config: the loss options a run gets unless it sets them, decided in one place.

Two rules, applied when the config is built (``TrainConfig``'s validator, :func:`resolve_loss_defaults`)
to the ``loss`` options the user (or the objective's row) left unset:

* **the backend's own defaults** (``BACKENDS[...].loss_defaults``): ``loss.mismatch = tis`` on SGLang,
  whose bf16 sampler differs from the fp32 trainer even when nothing is stale (docs/sglang.md);
* **overlapped rollouts are corrected, on every backend**: with ``rollout.max_staleness >= 1`` the
  tokens of an update were drawn by a behaviour policy mu up to k weight versions old, while the
  clipped ratio is pi_theta / pi_prox with pi_prox recomputed just before the update. So
  ``loss.mismatch`` defaults to ``decoupled`` (decoupled PPO, as AReaL trains asynchronously: the
  clip acts on the update's own step, and mu enters through the weight pi_prox / mu of each item;
  ``srpo/mismatch.py``), whatever the backend, and an explicit ``loss.mismatch = none`` beside
  ``max_staleness >= 1`` is refused (:func:`check_staleness_corrected`).

The resolved value is written to ``RUN_DIR/config.toml`` like every other option.
"""

from __future__ import annotations

from typing import Any

from srpo_graph.backends import BACKENDS
from srpo_graph.errors import ConfigError
from srpo_graph.srpo.options import LossConfig, Mismatch

STALE_MISMATCH = Mismatch.DECOUPLED  # the correction overlapped rollouts get unless one is set


def loss_defaults(backend: str, max_staleness: int) -> dict[str, Any]:
    """The loss options ``backend`` at ``max_staleness`` sets unless the run sets them.

    >>> [loss_defaults(b, k).get("mismatch") for b in ("transformers", "sglang") for k in (0, 1)]
    [None, 'decoupled', 'tis', 'decoupled']
    """
    spec = BACKENDS.get(backend)
    out: dict[str, Any] = dict(spec.loss_defaults) if spec is not None else {}
    if max_staleness >= 1:
        out["mismatch"] = STALE_MISMATCH.value
    return out


def check_staleness_corrected(mismatch: Any, max_staleness: int) -> None:
    """Refuse stale samples trained with no correction against the policy that sampled them.

    Raises:
        ConfigError: ``mismatch`` is ``none`` and ``max_staleness >= 1``, naming both fields and the fix.

    >>> check_staleness_corrected("none", 0); check_staleness_corrected("tis", 2)
    """
    if max_staleness >= 1 and Mismatch(mismatch) is Mismatch.NONE:
        raise ConfigError.at(
            "fields `loss.mismatch` and `rollout.max_staleness`",
            f"loss.mismatch = none with rollout.max_staleness = {max_staleness} trains on outputs sampled up to "
            f"{max_staleness} weight version{'s' if max_staleness > 1 else ''} ago with no correction for the "
            "policy that sampled them",
            why="the clipped ratio is against the proximal policy recomputed before the update; the behaviour "
                "policy's log-probs enter the loss only through loss.mismatch",
            fix=f"remove loss.mismatch (overlapped rollouts default to {STALE_MISMATCH.value}), set "
                f"loss.mismatch = {STALE_MISMATCH.value} (or tis / mask), or set rollout.max_staleness = 0",
        )


def _get(section: Any, key: str, default: Any) -> Any:
    return section.get(key, default) if isinstance(section, dict) else getattr(section, key, default)


def resolve_loss_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a config's plain data, the objective's row already filled in) with :func:`loss_defaults`
    under the ``loss`` options it sets; values of the wrong type are left for validation to report.

    Raises:
        ConfigError: an explicit ``loss.mismatch = none`` with ``rollout.max_staleness >= 1``.

    >>> resolve_loss_defaults({"rollout": {"max_staleness": 1}})["loss"]
    {'mismatch': 'decoupled'}
    """
    rollout, loss = data.get("rollout", {}), data.get("loss", {})
    k, backend = _get(rollout, "max_staleness", 0), _get(rollout, "backend", "transformers")
    if not isinstance(k, int) or isinstance(k, bool) or not isinstance(backend, str):
        return data
    given = dict(loss) if isinstance(loss, dict) else loss.model_dump(exclude_unset=True) \
        if isinstance(loss, LossConfig) else None
    if given is None:
        return data
    if "mismatch" in given:
        try:
            check_staleness_corrected(given["mismatch"], k)
        except ValueError:  # not a Mismatch: validation names it
            pass
    missing = {key: v for key, v in loss_defaults(backend, k).items() if key not in given}
    return {**data, "loss": {**given, **missing}} if missing else data


def with_loss_defaults(config: Any) -> Any:
    """A built ``TrainConfig`` with :func:`loss_defaults` for the loss options it leaves unset (a no-op on a
    config from ``validate``, which resolved them; this covers one made by ``model_copy``), checked by
    :func:`check_staleness_corrected`."""
    k = config.rollout.max_staleness
    missing = {key: v for key, v in loss_defaults(config.rollout.backend, k).items()
               if key not in config.loss.model_fields_set}
    if missing:
        coerced = type(config.loss).model_validate(missing)  # e.g. "tis" -> Mismatch.TIS
        config = config.model_copy(update={"loss": config.loss.model_copy(
            update={key: getattr(coerced, key) for key in missing})})
    check_staleness_corrected(config.loss.mismatch, k)
    return config


__all__ = ["STALE_MISMATCH", "check_staleness_corrected", "loss_defaults", "resolve_loss_defaults",
           "with_loss_defaults"]
