"""CLI commands of the runtime stage: ``run`` here, ``show`` and ``init-model`` in show_commands.py.

Listed in ``COMMANDS`` and registered by ``srpo_graph.cli``. Heavy imports (torch,
transformers) happen inside the commands so ``srpo-graph check`` starts fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from srpo_graph.errors import ConfigError, RuntimeFailure
from srpo_graph.fmt import fixed


def parse_model_overrides(values: tuple[str, ...], policies: list[str]) -> dict[str, str]:
    """``--model NAME`` (every policy) and ``--model POLICY=NAME`` -> policy -> model.

    >>> parse_model_overrides(("tiny",), ["p", "q"])
    {'p': 'tiny', 'q': 'tiny'}
    >>> parse_model_overrides(("tiny", "q=/models/x"), ["p", "q"])
    {'p': 'tiny', 'q': '/models/x'}
    """
    out: dict[str, str] = {}
    pairs = [v.partition("=") for v in values]
    for pol, eq, name in pairs:  # bare names first: they apply to every policy
        if not (eq and pol.isidentifier()):
            out.update({p: pol + eq + name for p in policies})
    for pol, eq, name in pairs:  # then POLICY=NAME, whatever the order on the command line
        if eq and pol.isidentifier():
            if pol not in policies:
                raise ConfigError(
                    f"--model {pol}={name}: the workflow has no policy {pol!r} (policies: {', '.join(policies)})"
                )
            out[pol] = name
    return out


def declared_policies(workflow_file: str | Path) -> list[str]:
    """The policies of a ``.wf`` file a ``--model`` may name (all but ``openai(...)`` ones), read from
    its syntax tree: before the check, which then judges the overridden models."""
    from srpo_graph.lang import ast, parse
    from srpo_graph.lang.parser import read_source

    module = parse(read_source(workflow_file), str(workflow_file))
    return [it.name.value for it in module.items
            if isinstance(it, ast.PolicyDecl) and not isinstance(it.model, ast.OpenaiExpr)]


def _backend_names() -> list[str]:
    from srpo_graph.backends import BACKENDS

    return list(BACKENDS)


def _scalar_type(ann):
    """The click type of a scalar options field, or None (dicts and tuples stay config-only)."""
    import types
    import typing

    union = typing.get_origin(ann) in (typing.Union, types.UnionType)
    args = [a for a in (typing.get_args(ann) if union else (ann,)) if a is not type(None)]
    if len(args) == 1 and args[0] in (str, int, float, Path):
        return click.Path(path_type=Path) if args[0] is Path else args[0]
    return None


def _backend_options(fn):
    """One ``--<backend>-<field>`` flag per scalar field of every backend's options
    (``backends.BACKENDS``; short names from a field's ``json_schema_extra["cli"]``), collected
    into ``backend_flags`` ({(backend, field): value} of the flags given)."""
    from srpo_graph.backends import BACKENDS

    params = []
    for kind, spec in BACKENDS.items():
        for name, info in spec.options.model_fields.items():
            typ = _scalar_type(info.annotation)
            if typ is None:
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("train_only"):
                continue
            flags = [f"--{kind}-{name.replace('_', '-')}", *extra.get("cli", [])]
            default = info.get_default(call_default_factory=True)
            params.append(
                click.option(
                    *flags,
                    f"{kind}__{name}",
                    type=typ,
                    default=None,
                    help=f"{kind}: {info.description} [default: {default}]",
                )
            )
    for opt in reversed(params):
        fn = opt(fn)
    return fn


def _options_from_flags(kind: str, flags: dict):
    """The options of backend ``kind`` from ``--<kind>-<field>`` flags; a flag of another backend is an error."""
    from pydantic import ValidationError

    from srpo_graph.backends import backend_spec

    given = {k: v for k, v in flags.items() if v is not None}
    other = sorted(k for k in given if not k.startswith(kind + "__"))
    if other:
        names = ", ".join("--" + k.replace("__", "-").replace("_", "-") for k in other)
        raise ConfigError.at(
            "run",
            f"{names} belong to another backend than --backend {kind}",
            fix=f"pass --backend {other[0].split('__')[0]}, or drop the flag",
        )
    try:
        return backend_spec(kind).options(**{k.split("__", 1)[1]: v for k, v in given.items()})
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ConfigError.at("run", f"--{kind}-{str(e['loc'][0]).replace('_', '-')}: {e['msg']}") from None


@click.command("run")
@click.argument("workflow_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--tasks",
    "tasks_file",
    required=True,
    type=click.Path(),
    help="Task file: JSONL, or through Hugging Face `datasets` a .parquet file or a save_to_disk folder "
    "(FOLDER@split for a DatasetDict).",
)
@click.option("--samples", default=8, show_default=True, help="Episodes per task (the group size G).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Trace JSONL to write.")
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(_backend_names()),
    default="transformers",
    show_default=True,
    help="Inference engine (backends.BACKENDS); its options are the --<backend>-<field> flags.",
)
@click.option("--model", "models", multiple=True, help="NAME for every policy, or POLICY=NAME (repeatable).")
@click.option("--seed", default=0, show_default=True)
@click.option("--limit", type=int, default=None, help="Only the first N tasks.")
@click.option("--device", default="cpu", show_default=True, help="transformers backend device.")
@click.option("--max-concurrent", type=int, default=None, help="Most episodes alive at once (default: all).")
@click.option(
    "--threads",
    type=int,
    default=None,
    help="torch CPU threads (default: 1 when every model is small, hidden size <= 256, else torch's default).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--deadline",
    "deadlines",
    multiple=True,
    metavar="KIND=SECONDS",
    help="Seconds a user call may take, per kind: tool, reward, extractor (repeatable; defaults "
    "60/10/10). Past it the episode fails naming the call's .wf line.",
)
@_backend_options
def run_cmd(
    workflow_file,
    tasks_file,
    samples,
    out_file,
    backend_kind,
    models,
    seed,
    limit,
    device,
    max_concurrent,
    threads,
    quiet,
    deadlines,
    **backend_flags,
):
    """Run every task SAMPLES times and write one trace line per episode.

    Episodes are appended to OUT (flushed) as soon as they finish, so a run that stops early
    -- a backend that stops answering, Ctrl-C -- leaves the finished ones in a valid file; a run
    that completes rewrites OUT in task order.
    """
    from rich.console import Console

    from srpo_graph.backends import backend_spec, load_backend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.tasks import load_tasks

    limits = parse_deadlines(deadlines)
    overrides = parse_model_overrides(models, declared_policies(workflow_file)) if models else {}
    wf = load_workflow(workflow_file, models=overrides)  # the check judges the models that will run
    tasks = load_tasks(tasks_file, wf)[: limit if limit else None]
    chosen = {p.name: p.model for p in wf.policies if p.external is None}  # external: their own endpoint
    chosen.update(overrides)
    options = _options_from_flags(backend_kind, backend_flags)
    if backend_spec(backend_kind).in_process:
        import torch

        from srpo_graph.models import cpu_threads

        # small models are far faster on one thread; on a busy CPU more threads can be 50x slower
        # (models/__init__.py, Note [Threads for small models])
        threads = threads or (cpu_threads(chosen.values()) if device == "cpu" else None)
        if threads:
            torch.set_num_threads(threads)
    by_model = {m: load_backend(backend_kind, m, options, device=device) for m in dict.fromkeys(chosen.values())}
    backends = {p: by_model[m] for p, m in chosen.items()}
    from srpo_graph.backends.openai import OpenAIBackend

    external = {p.name: OpenAIBackend(p.external) for p in wf.policies if p.external is not None}
    backends.update(external)
    by_model.update({f"external:{n}": b for n, b in external.items()})  # closed with the others
    console = Console(stderr=True)
    try:
        # an external endpoint that fails or stalls fails its episodes (URL named), the run goes on
        result = run_streaming(
            wf,
            tasks,
            backends,
            Path(out_file),
            console,
            samples=samples,
            seed=seed,
            progress=not quiet,
            max_concurrent=max_concurrent,
            on_backend_error="fail" if external else "raise",
            deadlines=limits,
        )
    finally:
        for b in by_model.values():
            b.close()
    s = result.stats
    console.print(
        f"[bold]{wf.name}[/]: {s.episodes} episodes ({len(tasks)} tasks x {samples}), mean reward "
        f"{fixed(s.mean_reward)}, {s.tokens_generated} tokens generated in {s.seconds:.2f}s "
        f"({s.tokens_per_second:,.0f} tokens/s, {s.generate_calls} batches), failures {s.failures}, "
        f"truncated {s.truncated} -> {out_file}"
    )
    for kind, msg in sorted(s.first_failure.items()):  # the first failure of each kind, once
        console.print(
            f"[yellow]{s.failed_by_kind[kind]} failed ({kind}), first:[/] {msg}",
            markup=True,
            highlight=False,
            soft_wrap=True,
        )  # unwrapped: the .wf path stays one copyable word
    if s.episodes and s.failures == s.episodes:
        raise RuntimeFailure.at(
            str(workflow_file),
            f"every one of the {s.episodes} episodes failed (see above); {out_file} holds them with their errors",
        )


def parse_deadlines(items) -> object:
    """``--deadline tool=5 --deadline reward=1`` -> ``Deadlines``.

    Raises:
        ConfigError: not ``KIND=SECONDS``, an unknown kind, or not a positive number.
    """
    from pydantic import ValidationError

    from srpo_graph.runtime.usercode import Deadlines

    given: dict[str, str] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind.strip() not in Deadlines.model_fields:
            raise ConfigError.at(
                f"--deadline {item}",
                f"expected KIND=SECONDS with KIND one of {', '.join(Deadlines.model_fields)}",
                fix="e.g. --deadline reward=5",
            )
        given[kind.strip()] = value.strip()
    try:
        return Deadlines(**given)  # pydantic converts the strings
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ConfigError.at(f"--deadline {e['loc'][0]}={given.get(str(e['loc'][0]))}", str(e["msg"])) from None


def run_streaming(wf, tasks, backends, out: Path, console, **run_kw):
    """:func:`~srpo_graph.runtime.executor.run`, each finished episode appended to ``out`` at once.

    On success ``out`` is rewritten (atomically) in task-major order. If the run stops -- any
    exception, Ctrl-C -- the episodes finished so far stay in ``out`` (one flushed JSON line
    each, so the file is valid), a note says how many, and the exception goes on.
    """
    import os

    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.trace import write_traces

    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with out.open("w", encoding="utf-8") as fh:

        def stream(ep) -> None:
            nonlocal written
            fh.write(ep.to_json() + "\n")
            fh.flush()
            written += 1

        try:
            result = run(wf, tasks, backends, on_episode=stream, **run_kw)
        except KeyboardInterrupt:  # one line, exit 130 (cli.py)
            from srpo_graph.exiting import Interrupted

            raise Interrupted(f"srpo-graph run: interrupted; the {written} episodes finished before are in {out} "
                              "(valid JSONL)") from None
        except BaseException:
            console.print(f"[red]run stopped by an error[/]: the {written} episodes finished before are in {out} "
                          "(valid JSONL)")
            raise
    tmp = out.with_name(out.name + ".tmp")
    write_traces(tmp, result.episodes)
    os.replace(tmp, out)
    return result


COMMANDS: list = [run_cmd]
