"""Trainer stage: rollouts on SGLang servers -- which server samples for which policy, who starts
and stops them, the failure budget, and the sampler/trainer mismatch per agent.

Consumes the ``rollout`` section of :class:`~srpo_graph.train.config.TrainConfig` and the
workflow's policies; produces one :class:`~srpo_graph.backends.sglang.SGLangBackend` per policy
(each its own server: policies' weights diverge as they train). Knows nothing about losses.

* ``rollout.sglang_launch`` set: one server per policy is started here (all at once, then each
  waited for), on ports ``sglang_port + i``; they are stopped by :func:`server_scope` when
  training ends, fails or is interrupted, and by ``sglang_server``'s exit hook and parent-death
  signal if the trainer itself dies (see ``backends/sglang_server.py``).
* otherwise each policy connects to ``sglang_urls[policy]`` or ``sglang_url``; two policies on
  one URL are refused (one server holds one set of weights).
* the objective's set-level mismatch correction defaults to ``tis`` on SGLang (Note [Mismatch
  on SGLang] in docs/sglang.md): the server samples in bf16 with its own kernels while the
  trainer recomputes in fp32, so ``old_logprobs`` != sampler log-probs; an explicit
  ``loss.mismatch`` is kept.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from srpo_graph.backends import load_backend, resolve_model, sglang_server
from srpo_graph.errors import BackendError, ConfigError


@contextlib.contextmanager
def server_scope() -> Iterator[None]:
    """Stop every SGLang server started inside the block when it exits (normally or not)."""
    before = {id(s) for s in sglang_server.live_servers()}
    try:
        yield
    finally:
        for s in sglang_server.live_servers():
            if id(s) not in before:
                s.stop()


def with_sglang_defaults(config: Any) -> Any:
    """``config`` with ``loss.mismatch = tis`` when the backend is sglang and it was not set explicitly."""
    if config.rollout.backend != "sglang" or "mismatch" in config.loss.model_fields_set:
        return config
    from srpo_graph.srpo.loss import Mismatch

    return config.model_copy(update={"loss": config.loss.model_copy(update={"mismatch": Mismatch.TIS})})


def sglang_backends(wf: Any, config: Any, run_dir: Path) -> dict[str, Any]:
    """One connected SGLang backend per policy of ``wf`` (servers launched first if configured).

    Raises:
        ConfigError: a URL for an unknown policy, two policies on one server, router workers
            with several policies.
        BackendError: a server that cannot start or does not answer ``/health``.
    """
    r = config.rollout
    names = [p.name for p in wf.policies]
    unknown = sorted(set(r.sglang_urls) - set(names))
    if unknown:
        raise ConfigError(f"field `rollout.sglang_urls`: error: no policy named {unknown} in workflow {wf.name!r} "
                          f"(policies: {names})\n  fix: key the URLs by policy name")
    if r.sglang_workers and len(names) > 1:
        raise ConfigError("field `rollout.sglang_workers`: error: router workers are for a one-policy workflow; "
                          f"{wf.name!r} has {len(names)} policies\n  fix: give each policy its own server in "
                          "`rollout.sglang_urls`")
    models = {p.name: resolve_model(p.model) for p in wf.policies}
    if r.sglang_launch is not None:
        servers = [sglang_server.SGLangServer(
            sglang_server.launch_command(r.sglang_launch, models[n], r.sglang_port + i), r.sglang_port + i,
            log_path=run_dir / "sglang" / f"{n}.log",
            env={"SGLANG_USE_CPU_ENGINE": "1"} if r.sglang_launch == "cpu" else None) for i, n in enumerate(names)]
        for s in servers:
            s.start()
        for s in servers:
            s.wait_healthy(r.sglang_health_timeout)
        urls = {n: s.url for n, s in zip(names, servers)}
    else:
        urls = {n: r.sglang_urls.get(n, r.sglang_url) for n in names}
        shared = [n for n in names if list(urls.values()).count(urls[n]) > 1]
        if shared:
            raise ConfigError(f"field `rollout.sglang_urls`: error: policies {shared} would share the server "
                              f"{urls[shared[0]]}, which holds one set of weights\n  fix: one server per policy "
                              "(`rollout.sglang_urls={name=URL,...}`), or let training start them (`rollout.sglang_launch=cpu`)")
    weight_root = Path(r.weight_dir) if r.weight_dir is not None else run_dir / "weights"
    backends = {}
    for n in names:
        backends[n] = load_backend("sglang", models[n], url=urls[n], worker_urls=list(r.sglang_workers) or None,
                                   weight_dir=weight_root / n, timeout=r.sglang_timeout, max_retries=r.sglang_retries)
    return backends


def check_failure_budget(stats: Any, config: Any) -> None:
    """Stop the run when more of a step's episodes failed on backend errors than the budget allows.

    Raises:
        BackendError: naming the share, the budget, the first error and how to continue.
    """
    if stats is None or not stats.episodes or not stats.backend_failures:
        return
    share = stats.backend_failures / stats.episodes
    budget = config.rollout.max_failed_fraction
    if share > budget:
        raise BackendError(
            f"rollout stopped: {stats.backend_failures} of {stats.episodes} episodes failed on backend errors "
            f"({share:.0%} > rollout.max_failed_fraction={budget:g}); first: {stats.backend_error}\n"
            "  fix: check the server (its log is in RUN_DIR/sglang/ when training started it), then continue "
            "with `srpo-graph train FILE.wf --resume RUN_DIR`")


def rollout_metrics(stats: Any) -> dict[str, float]:
    """The rollout's backend health for metrics.jsonl (``rollout/...``)."""
    if stats is None:
        return {}
    return {"rollout/backend_failures": stats.backend_failures, "rollout/stale_outputs": stats.stale_outputs}


def agent_mismatch(batch: Any) -> dict[str, float]:
    """Mean and max |trainer - sampler| log-prob gap per agent, over completion tokens.

    ``batch`` must have ``old_logprobs`` recomputed (``update.recompute_old_logprobs``).
    Returns ``{"<agent>/mean_abs": .., "<agent>/max_abs": ..}`` (under ``mismatch/`` in metrics).
    """
    import torch

    if not batch.num_sets or batch.member_agent is None or not batch.agents:
        return {}
    lengths = batch.member_offsets[1:] - batch.member_offsets[:-1]
    token_agent = torch.repeat_interleave(batch.member_agent.cpu(), lengths.cpu())  # [T]
    mask = batch.loss_mask.bool().cpu()
    gap = (batch.old_logprobs.float().cpu() - batch.sampler_logprobs.float().cpu()).abs()
    out: dict[str, float] = {}
    for i, name in enumerate(batch.agents):
        sel = mask & (token_agent == i)
        if bool(sel.any()):
            out[f"{name}/mean_abs"] = float(gap[sel].mean())
            out[f"{name}/max_abs"] = float(gap[sel].max())
    return out


__all__ = ["agent_mismatch", "check_failure_budget", "rollout_metrics", "server_scope", "sglang_backends",
           "with_sglang_defaults", "BackendError"]
