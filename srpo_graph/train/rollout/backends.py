"""Trainer stage, rollouts: the backends the rollout samples from, and the servers' lifetime.

Consumes the trained policies' slots (``policies/``), the frozen and external policies and the
run's config; produces:

* :func:`attach_backends`: each trained slot's ``backend`` and a backend per frozen policy, built
  by the backend's row in ``backends.BACKENDS`` (``for_training``: in process for
  ``transformers``, SGLang servers for ``sglang``) -- or the rollout worker process
  (``worker/``) when ``rollout.worker`` is on. Only the ranks that sample build backends (rank 0
  alone starts servers);
* :func:`server_scope`: every server started inside it stops when training ends, fails or is
  interrupted (``sglang_server``'s exit hook and parent-death signal cover a trainer that dies).

A backend's ``loss_defaults`` (``loss.mismatch = tis`` on SGLang) are applied when the config is
built (``train/config/defaults.py``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Sequence

from srpo_graph.backends import TrainedPolicy, backend_spec, sglang_server
from srpo_graph.errors import ConfigError
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.policies import frozen as frozen_policies
from srpo_graph.train.policies import lora
from srpo_graph.train.rollout.ranks import samples_on_every_rank
from srpo_graph.train.rollout.worker.client import start_for_training


def load_frozen(wf: Any, config: Any, device: str, dist: DistInfo) -> tuple[list[TrainedPolicy], dict[str, Any]]:
    """The frozen and external policies, on the ranks that sample in this process (a rollout worker
    loads its own): ``frozen.load_frozen`` there, nothing elsewhere."""
    if (dist.is_main or samples_on_every_rank(config, dist)) and not config.rollout.worker:
        return frozen_policies.load_frozen(wf, config, device)
    return [], {}


def attach_backends(wf: Any, config: Any, slots: Sequence[Any], frozen_local: Sequence[TrainedPolicy],
                    external: dict[str, Any], device: str, dist: DistInfo) -> dict[str, Any]:
    """Give every trained slot its ``backend``; return the backend of every frozen and external
    policy (``frozen_local``'s are built with the same ``for_training`` call as the trained ones,
    so e.g. SGLang servers get distinct ports). On a rank that does not sample: nothing.

    Raises:
        ConfigError: frozen policies beside LoRA adapters on a server backend.
        BackendError: a backend that does not start.
    """
    if not (dist.is_main or samples_on_every_rank(config, dist)):
        return {}
    spec = backend_spec(config.rollout.backend)
    trained = [TrainedPolicy(s.name, s.base, s.replica if s.replica is not None else s.model, s.tokenizer, device)
               for s in slots]
    if frozen_local and lora.uses_adapters(wf) and not spec.in_process:
        raise ConfigError.at("field `rollout.backend`", "frozen policies beside LoRA adapters need the "
                             "transformers backend", fix='rollout.backend = "transformers"')
    if config.rollout.worker:  # sampling in a process of its own (worker/); it builds the frozen ones
        backends: dict[str, Any] = start_for_training(wf, config, slots, device)
    else:
        options = getattr(config.rollout, config.rollout.backend)
        backends = spec.for_training([*trained, *frozen_local], options, Path(config.run_dir or "runs"))
    for s in slots:
        s.backend = backends[s.name]
    return {**external, **{p.name: backends[p.name] for p in frozen_local}}


@contextlib.contextmanager
def server_scope() -> Iterator[None]:
    """Stop every SGLang server started inside the block when it exits (normally or not), and release
    the weight-folder leases this process holds (Note [A weight folder's lease]: the next run, or an
    in-process resume, need not wait for their expiry)."""
    from srpo_graph.backends.weight_lease import held, release_all

    before, leases = {id(s) for s in sglang_server.live_servers()}, held()
    try:
        yield
    finally:
        release_all(keep=leases)
        for s in sglang_server.live_servers():
            if id(s) not in before:
                s.stop()

