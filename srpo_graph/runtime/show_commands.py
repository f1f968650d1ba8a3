"""CLI commands of the runtime stage that look at what ``run`` needs or wrote: ``show`` (traces, with
their prompts decoded by the policies' tokenizers) and ``init-model`` (the local models).

Listed in ``COMMANDS`` and registered by ``srpo_graph.cli``. Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from srpo_graph.errors import ConfigError
from srpo_graph.runtime.commands import parse_model_overrides


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


COMMANDS: list = [show_cmd, init_model_cmd]
