"""Which SGLang servers serve which policies: the fleet of a run, launched or connected.

Backends stage. Consumes the trained policies (``backends.TrainedPolicy``, in declaration order),
the ``rollout.sglang`` options (``backends.options.SGLangOptions``) and the run folder; produces
one connected :class:`~srpo_graph.backends.sglang.SGLangBackend` per policy
(``BACKENDS["sglang"].for_training``), and :func:`connect`, the one client builder behind
``BACKENDS["sglang"].load`` (``srpo-graph run --backend sglang``).

The plan:

* full policies: every policy gets a server of its own (policies' weights diverge as they
  train); launched ones (``rollout.sglang.launch``) all start before any is waited for;
* LoRA adapter policies (``sglang_lora.py``): ONE server per shared base, started with the
  base's adapter flags, one :class:`~srpo_graph.backends.sglang_lora.SGLangAdapterBackend` per
  policy on it;
* servers a run did not launch (``url``/``urls``) get no weight updates unless
  ``rollout.sglang.update_connected`` says so (:func:`refuse_connected`).

Processes are ``sglang_server.py``'s (start, health, stop; it knows nothing of policies or
LoRA); the adapter protocol is ``sglang_lora.py``'s. This module knows nothing of training
beyond the policies it is handed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from srpo_graph.backends.base import context_length_of
from srpo_graph.backends.options import SGLangOptions
from srpo_graph.backends.ports import release
from srpo_graph.backends.sglang import SGLangBackend
from srpo_graph.backends.sglang_lora import (
    ADAPTERS_BY_DISK,
    CPU_PIN_SHIM,
    SGLangAdapterBackend,
    is_adapter_policy,
    lora_flags,
)
from srpo_graph.backends.sglang_server import SGLangServer, launch_command, launch_ports, recipe_env
from srpo_graph.backends.weight_dir import run_owner
from srpo_graph.errors import ConfigError
from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import load_tokenizer


def connect(model: str, options: SGLangOptions, **kw: Any) -> SGLangBackend:
    """An :class:`~srpo_graph.backends.sglang.SGLangBackend` on a running server.

    Args:
        model: the model name/path whose tokenizer (and config: vocabulary, context length) to load.
        options: the ``rollout.sglang`` options (``url``, timeouts, the weight sync).
        kw: passed on to the backend's constructor, over ``options`` (``url``, ``weight_dir``, ...).
    """
    path = resolve_model(model)
    if "vocab_size" not in kw or "context_length" not in kw:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError):
            config = None  # constrained requests will then say what is missing; lengths go unchecked
        kw.setdefault("vocab_size", getattr(config, "vocab_size", None))  # logit rows, for `allow:`
        kw.setdefault("context_length", context_length_of(config))
    kw = {"timeout": options.timeout, "max_retries": options.retries, "worker_urls": list(options.workers) or None,
          "sync": options.sync, "sync_options": {"bucket_bytes": int(options.sync_bucket_mb * (1 << 20)),
                                                 "master_address": options.sync_address,
                                                 "timeout": options.sync_timeout},
          **({"weight_dir": options.weight_dir} if options.weight_dir is not None else {}), **kw}
    return SGLangBackend(kw.pop("url", options.url), load_tokenizer(path), **kw)


def serve_policies(policies: Sequence[Any], options: SGLangOptions, run_dir: Path) -> dict[str, Any]:
    """One connected SGLang backend per trained policy: ``BACKENDS["sglang"].for_training``.

    Servers are launched first (all at once, then each waited for, on ports ``options.port + i``)
    when ``options.launch`` is set; otherwise each policy connects to ``options.urls[name]`` or
    ``options.url``. Every policy gets its own server: policies' weights diverge as they train.

    Args:
        policies: the trained policies (``backends.TrainedPolicy``), in declaration order.
        options: the ``rollout.sglang`` section (``backends.options.SGLangOptions``).
        run_dir: the run folder (server logs in ``run_dir/sglang/``, weights in ``run_dir/weights``).
    Raises:
        ConfigError: a URL for an unknown policy, two policies on one server, router workers
            with several policies.
        BackendError: a server that cannot start or does not answer ``/health``.
    """
    if any(is_adapter_policy(p) for p in policies):  # LoRA adapters: one server per shared base
        return serve_adapters(policies, options, run_dir)
    names = [p.name for p in policies]
    unknown = sorted(set(options.urls) - set(names))
    if unknown:
        raise ConfigError.at("field `rollout.sglang.urls`", f"no policy named {unknown} in the workflow "
                             f"(policies: {names})", fix="key the URLs by policy name")
    if options.workers and len(names) > 1:
        raise ConfigError.at("field `rollout.sglang.workers`", "router workers are for a one-policy workflow; "
                             f"this one has {len(names)} policies",
                             fix="give each policy its own server in `rollout.sglang.urls`")
    models = {p.name: p.model_path for p in policies}
    if options.launch is not None:
        ports = launch_ports(options.port, len(names))
        try:
            servers = [SGLangServer(
                launch_command(options.launch, models[n], port), port,
                log_path=run_dir / "sglang" / f"{n}.log",
                env=recipe_env(options.launch))
                for n, port in zip(names, ports)]
        except BaseException:  # no server made: the ports claimed for them go back (a server's stop releases its own)
            release(ports)
            raise
        for s in servers:
            s.start()
        for s in servers:
            s.wait_healthy(options.health_timeout)
        urls = {n: s.url for n, s in zip(names, servers)}
    else:
        urls = {n: options.urls.get(n, options.url) for n in names}
        shared = [n for n in names if list(urls.values()).count(urls[n]) > 1]
        if shared:
            raise ConfigError.at("field `rollout.sglang.urls`", f"policies {shared} would share the server "
                                 f"{urls[shared[0]]}, which holds one set of weights",
                                 fix="one server per policy (`rollout.sglang.urls={name=URL,...}`), "
                                 "or let training start them (`rollout.sglang.launch=cpu`)")
        refuse_connected(options, [*urls.values(), *options.workers])
    weight_root = Path(options.weight_dir) if options.weight_dir is not None else run_dir / "weights"
    owner = run_owner(run_dir)  # the one ownership rule of the weight folders (weight_dir.py)
    return {n: connect(models[n], options, url=urls[n], weight_dir=weight_root / n, weight_owner=owner)
            for n in names}


def serve_adapters(policies: Sequence[Any], options: Any, run_dir: Path) -> dict[str, Any]:
    """One backend per policy; the policies of one shared base share one server.

    Launched servers (``options.launch``) get ports ``options.port + i`` for base i; otherwise
    the base's server is ``options.urls[<base policy>]`` or ``options.url``. Every adapter is
    loaded once here (its initial weights), so sampling can start.

    Raises:
        ConfigError: full policies mixed with adapters (serve those on their own servers);
            ``options.sync = "distributed"`` (Note [Adapters sync by disk] in ``sglang_lora.py``).
        BackendError: a server that cannot start or refuses an adapter.
    """
    from transformers import AutoConfig

    if getattr(options, "sync", "auto") == "distributed":  # Note [Adapters sync by disk] (sglang_lora.py)
        raise ConfigError.at("field `rollout.sglang.sync`", "LoRA adapters cannot sync over a process group on "
                             "SGLang 0.5.23", why=ADAPTERS_BY_DISK,
                             fix='rollout.sglang.sync = "auto" (adapters by disk: the servers must read '
                                 "rollout.sglang.weight_dir)")
    full = [p.name for p in policies if not is_adapter_policy(p)]
    if full:
        raise ConfigError.at(
            "field `rollout.backend`",
            f"policies {full} are full models and the others LoRA adapters; "
            "the SGLang backend serves a workflow of adapters on shared bases only",
            fix="declare every policy as lora(...) on a base, or use rollout.backend=transformers",
        )
    groups: dict[int, list[Any]] = {}
    for p in policies:
        groups.setdefault(id(p.model.shared_base), []).append(p)
    weight_root = Path(options.weight_dir) if options.weight_dir is not None else run_dir / "weights"
    # (policies of one base, its server or URL): every server starts before any is waited for
    plan: list[tuple[list[Any], Any]] = []
    ports = launch_ports(options.port, len(groups)) if options.launch is not None else []
    try:
        _plan_servers(groups, options, ports, run_dir, plan)
    except BaseException:  # the ports of servers never made go back (a made server's stop releases its own)
        release(ports[sum(not isinstance(where, str) for _, where in plan):])
        raise
    refuse_connected(options, [where for _, where in plan if isinstance(where, str)])
    backends: dict[str, Any] = {}
    for group, where in plan:
        url = where if isinstance(where, str) else where.wait_healthy(options.health_timeout).url
        try:
            config = AutoConfig.from_pretrained(group[0].model_path)
        except (OSError, ValueError):
            config = None
        vocab, context = getattr(config, "vocab_size", None), context_length_of(config)
        for p in group:
            b = SGLangAdapterBackend(
                url,
                p.tokenizer,
                adapter=p.model.lora_name,
                timeout=options.timeout,
                max_retries=options.retries,
                weight_dir=weight_root / p.name,
                vocab_size=vocab,
                context_length=context,
                weight_owner=run_owner(run_dir),
            )
            b.sync_weights(p.model, 0)  # the adapter as initialised (a resumed run syncs its own version next)
            backends[p.name] = b
    return backends


def refuse_connected(options: Any, urls: Sequence[str]) -> None:
    """A run writes weights only into servers it launched, unless ``update_connected`` says so.

    Raises:
        ConfigError: naming the servers, before anything is written.
    """
    if urls and not getattr(options, "update_connected", False):
        raise ConfigError.at(
            "field `rollout.sglang.update_connected`",
            f"training would push weight updates into {', '.join(sorted(set(urls)))}, a server this run did not launch",
            why="its weights would be replaced, for everyone else using it too",
            fix="let training start its own (`rollout.sglang.launch=cpu`), or, if the server is "
            "this run's to change, pass rollout.sglang.update_connected=true",
        )


def _plan_servers(groups: dict[int, list[Any]], options: Any, ports: list[int], run_dir: Path,
                  plan: list[tuple[list[Any], Any]]) -> None:
    """Append (policies of one base, its started server or its URL) to ``plan``, one per base."""
    for i, group in enumerate(groups.values()):
        base = next((p for p in group if p.model.lora_name is None), group[0])
        if options.launch is None:
            plan.append((group, options.urls.get(base.name, options.url)))
            continue
        cpu = options.launch == "cpu"
        argv = launch_command(options.launch, group[0].model_path, ports[i]) + lora_flags([p.model for p in group], cpu)
        env = None
        if cpu:
            shim = run_dir / "sglang" / "cpu-lora-shim"
            shim.mkdir(parents=True, exist_ok=True)
            (shim / "sitecustomize.py").write_text(CPU_PIN_SHIM)
            env = {**recipe_env("cpu"), "PYTHONPATH": str(shim)}
        plan.append(
            (group, SGLangServer(argv, ports[i], log_path=run_dir / "sglang" / f"{base.name}.log", env=env).start())
        )
