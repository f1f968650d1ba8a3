"""CLI commands of the runtime stage: ``run``, ``show``, ``init-model``.

Listed in ``COMMANDS`` and registered by ``srpo_graph.cli``. Heavy imports (torch,
transformers) happen inside the commands so ``srpo-graph check`` starts fast.
"""

from __future__ import annotations

import json
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


def prompt_models(
    traces_file: Path, workflow_file: str | None, models: tuple[str, ...], policies: list[str]
) -> dict[str, str]:
    """Which model's tokenizer decodes each policy's prompts for ``show``: ``--model`` flags, over
    ``--workflow``'s policy declarations, else the run folder's (a trace in ``RUN/traces/``: the
    ``.wf`` its ``workflow.json`` names, with ``config.toml``'s ``rollout.models``)."""
    import tomllib

    from srpo_graph.lang import load_workflow

    out: dict[str, str] = {}
    run_dir = traces_file.resolve().parent.parent if traces_file.resolve().parent.name == "traces" else None
    wf_path = workflow_file
    if wf_path is None and run_dir is not None and (run_dir / "workflow.json").is_file():
        try:
            wf_path = json.loads((run_dir / "workflow.json").read_text(encoding="utf-8")).get("file")
        except (OSError, ValueError):
            wf_path = None
    if wf_path is not None and Path(wf_path).is_file():
        out.update({p.name: p.model for p in load_workflow(wf_path).policies})
        if workflow_file is None and run_dir is not None and (run_dir / "config.toml").is_file():
            try:
                overrides = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
                overrides = overrides.get("rollout", {}).get("models", {}) or {}
            except (OSError, ValueError):
                overrides = {}
            for pol, name in overrides.items():
                out.update({p: name for p in out} if pol == "*" else {pol: name})
    out.update(parse_model_overrides(models, sorted(set(policies) | set(out))))
    return out


@click.command("show")
@click.argument("traces_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--episode", "index", type=int, default=None, help="Show only this episode (0-based line).")
@click.option(
    "--html", "html_file", type=click.Path(dir_okay=False), default=None, help="Write an HTML view of the episode(s)."
)
@click.option(
    "--workflow",
    "workflow_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The .wf the traces came from: --html then draws each episode on its routing graph.",
)
@click.option("--max", "max_shown", default=5, show_default=True, help="Episodes printed when --episode is not given.")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Tokenizer to decode prompts with: NAME for every policy, or POLICY=NAME (repeatable). "
    "Default: the --workflow's policies, else the run folder's workflow (RUN/traces/*.jsonl).",
)
@click.option(
    "--no-prompt", "hide_prompt", is_flag=True, default=False, help="Do not print the decoded prompt of each output."
)
def show_cmd(traces_file, index, html_file, workflow_file, max_shown, models, hide_prompt):
    """Print episodes readably: each output's decoded prompt and text, which transition consumed which
    outputs, rewards."""
    from rich.console import Console

    from srpo_graph.runtime.show import PromptDecoder, episode_html, print_episode
    from srpo_graph.runtime.trace import read_trace_set

    episodes = read_trace_set(traces_file)  # the rules compile applies: show never shows a file compile rejects
    if index is not None:
        if not 0 <= index < len(episodes):
            raise ConfigError(f"--episode {index}: {traces_file} has {len(episodes)} episodes (0..{len(episodes) - 1})")
        chosen = [(index, episodes[index])]
    else:
        chosen = list(enumerate(episodes))[:max_shown]
    console = Console()
    decode = None
    if not hide_prompt:
        # an external agent's output carries its messages: no tokenizer to find for it
        policies = sorted({o.policy for _, ep in chosen for o in ep.outputs if o.messages is None})
        decode = PromptDecoder(prompt_models(Path(traces_file), workflow_file, models, policies))
    for i, ep in chosen:
        print_episode(console, ep, i, decode)
    if index is None and len(episodes) > max_shown:
        console.print(f"... {len(episodes) - max_shown} more episodes (use --episode N)")
    if decode is not None and decode.missing:
        console.print(
            f"[dim]prompts of policy {', '.join(sorted(decode.missing))} not decoded: no local tokenizer "
            "known for it (pass --workflow WF or --model [POLICY=]NAME; --no-prompt hides prompts)[/]"
        )
    if html_file:
        wf = None
        if workflow_file:
            from srpo_graph.lang import load_workflow

            wf = load_workflow(workflow_file)
            other = sorted({ep.workflow.name for _, ep in chosen} - {wf.name})
            if other:
                raise ConfigError(f"--workflow {workflow_file} is workflow {wf.name!r}; the episodes ran {other}")
        page = episode_html([ep for _, ep in chosen], Path(traces_file).name, workflow=wf, decode=decode)
        Path(html_file).write_text(page, encoding="utf-8")
        console.print(f"wrote {html_file}")


@click.command("init-model")
@click.argument("directory", type=click.Path(file_okay=False), required=False)
@click.option(
    "--show-vocab",
    is_flag=True,
    default=False,
    help="Print the tiny model's vocabulary (id, token) with its special and role tokens.",
)
@click.option(
    "--recipe",
    "recipe",
    default=None,
    metavar="NAME",
    help="Build a small model pre-trained locally instead (tiny-reason, tiny-search; minutes on 1 thread), "
    'cached like the tiny model; policies name it as `policy m = "NAME"`.',
)
@click.option(
    "--model",
    "local",
    default=None,
    metavar="NAME",
    help="Build a Qwen/Llama-shaped model with a byte-level BPE tokenizer and its chat template instead: "
    "FAMILY-SIZE, FAMILY one of qwen2.5, qwen3, llama3 and SIZE one of test, mid, scale "
    "(e.g. qwen3-test), or one on a released tokenizer (needs `pip install 'srpo-graph[tokenizers]'`): "
    "qwen2.5-0.5b-2layer, qwen3-0.6b-2layer, qwen2.5-realvocab-test, qwen3-realvocab-test, "
    'llama3-realvocab-test; cached like the tiny model; policies name it as `policy m = "NAME"`.',
)
def init_model_cmd(directory, show_vocab, recipe, local):
    """Build the tiny default model into DIRECTORY (default: the cache used for policy "tiny")."""
    from srpo_graph.models.tiny import ROLE_TOKENS, SPECIAL_TOKENS, VOCAB, ensure_tiny_model

    if local is not None:
        from srpo_graph.models.architectures import LOCAL_MODELS, ensure_local_model, local_info
        from srpo_graph.models.released import SHAPED_MODELS, ensure_shaped_model, shaped_info

        if local in SHAPED_MODELS:
            path = ensure_shaped_model(local, directory)
            info = shaped_info(path)
            click.echo(
                f"{local} ready at {path}: {info['parameters']:,} parameters, vocabulary {info['vocab_size']:,} "
                f"rows ({info['tokenizer']['size']:,} tokens in {SHAPED_MODELS[local][0]}'s released tokenizer)"
            )
        elif local not in LOCAL_MODELS:
            raise click.BadParameter(
                f"unknown model {local!r} (known: {', '.join([*LOCAL_MODELS, *SHAPED_MODELS])})", param_hint="--model"
            )
        else:
            path = ensure_local_model(local, directory)
            info = local_info(path)
            click.echo(
                f"{local} ready at {path}: {info['parameters']:,} parameters, vocabulary {info['vocab_size']:,} "
                f"rows ({info['tokenizer_size']:,} tokens in the tokenizer)"
            )
        if show_vocab:
            from srpo_graph.models.tiny import load_tokenizer

            tok = load_tokenizer(path)
            for t, i in sorted(tok.get_added_vocab().items(), key=lambda kv: kv[1]):
                click.echo(f"  {i:6d}  {t!r}")
        return
    if recipe is not None:
        from srpo_graph.models.recipes import RECIPES, ensure_recipe_model, recipe_info

        if recipe not in RECIPES:
            raise click.BadParameter(f"unknown recipe {recipe!r} (known: {', '.join(RECIPES)})", param_hint="--recipe")
        click.echo(f"building {recipe}: {RECIPES[recipe].description} (cached after the first build)")
        path = ensure_recipe_model(recipe, directory, log=click.echo)
        info = recipe_info(path)
        click.echo(
            f"{recipe} ready at {path}: {info['parameters']:,} parameters, final SFT loss "
            f"{info['final_loss']:.3f}, built in {info['build_seconds']} s"
        )
        if "trained_rows" in info:  # on an exact vocabulary (models/chat_recipe.py)
            click.echo(f"  {info['family']}'s tokenizer ({info['vocab_size']:,} tokens), {info['trained_rows']} rows "
                       f"trained; mass on the others on held-out turns: {info['unused_mass']['mean']:.2e} mean")
        if show_vocab:
            vocabulary = RECIPES[recipe].vocabulary() if RECIPES[recipe].family is None else ()
            for i, tok in enumerate(vocabulary):
                click.echo(f"  {i:3d}  {tok!r}")
        return
    path = ensure_tiny_model(directory)
    click.echo(f"tiny model ready at {path}")
    if show_vocab:
        click.echo(f"vocabulary: {len(VOCAB)} tokens; upper case is lower-cased, any other character is <unk>")
        click.echo(f"  special: {' '.join(SPECIAL_TOKENS)} (encoding puts <bos> first)")
        click.echo(f'  roles:   {" ".join(ROLE_TOKENS)} (one token each: use them in prompts, e.g. "<a>{{task.x}}")')
        for i, tok in enumerate(VOCAB):
            click.echo(f"  {i:3d}  {tok!r}")


COMMANDS: list = [run_cmd, show_cmd, init_model_cmd]
