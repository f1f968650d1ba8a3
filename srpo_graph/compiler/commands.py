"""CLI commands of the compiler stage: ``compile`` and ``inspect`` (listed in ``COMMANDS``).

``srpo-graph compile traces.jsonl -o batch.safetensors`` reads a trace file (errors name the
file, line and field), compiles it and writes the SetBatch; ``srpo-graph inspect
batch.safetensors`` prints a summary table. torch is imported inside the commands so that
``srpo-graph check`` starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from srpo_graph.fmt import fixed


def _read(path: Path, skip_bad: bool) -> tuple[list, list[str], int]:
    from srpo_graph.errors import TraceError
    from srpo_graph.runtime.trace import iter_numbered_traces

    skipped: list[TraceError] = []
    episodes, where = [], []
    for lineno, episode in iter_numbered_traces(path, skip_bad=skip_bad, errors=skipped):
        episodes.append(episode)
        where.append(f"{path}:{lineno}")
    for exc in skipped:
        click.echo(f"skipped: {exc}", err=True)
    bad = len(skipped)
    if not episodes:
        raise TraceError.at(str(path), "no episodes to compile"
                            + (f" ({bad} bad lines skipped)" if bad else " (the file has no trace lines)"))
    return episodes, where, bad


_FLAG_NAMES = {"use_std": "--std/--no-std"}  # the one flag whose CLI name differs from its field


def _config_options(fn):
    """One option per :class:`CompileConfig` field (choices, defaults and help from the model)."""
    import enum
    import typing

    from srpo_graph.compiler.options import CompileConfig

    for name, info in reversed(list(CompileConfig.model_fields.items())):
        if name == "policies":
            continue
        flag = "--" + name.replace("_", "-")
        ann, default, help_ = info.annotation, info.default, info.description
        if isinstance(ann, type) and issubclass(ann, enum.Enum):
            opt = click.option(flag, name, type=click.Choice([m.value for m in ann]), default=default.value,
                               show_default=True, help=help_)
        elif typing.get_origin(ann) is typing.Literal:
            opt = click.option(flag, name, type=click.Choice(list(typing.get_args(ann))), default=default,
                               show_default=True, help=help_)
        elif ann is bool:
            pair = _FLAG_NAMES.get(name, f"{flag}/--no-{name.replace('_', '-')}")
            opt = click.option(pair, name, default=default, show_default=True, help=help_)
        else:
            opt = click.option(flag, name, type=ann, default=default, show_default=True, help=help_)
        fn = opt(fn)
    return fn


@click.command("compile")
@click.argument("traces", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The SetBatch file to write (.safetensors).")
@_config_options
@click.option("--policies", default="", help="Comma-separated policy order (policy ids).")
@click.option("--skip-bad", is_flag=True, help="Skip trace lines that do not validate (reported, counted).")
def compile_cmd(traces: Path, output: Path, policies: str, skip_bad: bool, **options) -> None:
    """Compile TRACES (JSONL episodes) into a packed SetBatch file.

    Every option is a field of the compiler's configuration (docs/algorithm.md states each
    rule); an objective's compile options are listed in docs/algorithm.md's objectives table.
    """
    from pydantic import ValidationError

    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.errors import ConfigError

    try:
        config = CompileConfig(**options, policies=tuple(p for p in policies.split(",") if p))
    except ValidationError as exc:
        raise ConfigError("; ".join(f"option --{'.'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}"
                                    for e in exc.errors())) from None
    episodes, where, bad = _read(traces, skip_bad)
    batch = compile(episodes, config, where=where)
    batch.stats.skipped_bad_lines = bad
    batch.save(output)
    s = batch.stats
    click.echo(f"{output}: {s.events} events, {s.members} members, {s.tokens} tokens "
               f"({s.completion_tokens} completion) in {batch.num_micro_batches} micro-batches; "
               f"dropped {s.dropped_incomplete_events} incomplete and {s.dropped_zero_variance_events} "
               f"zero-variance events; {s.failed_episodes} failed episodes ({s.dropped_failed_episodes} "
               f"dropped), {s.truncated_episodes} truncated ({s.dropped_truncated_episodes} dropped, "
               f"{s.penalized_truncated_episodes} penalized); {s.singleton_groups} singleton groups")


@click.command("inspect")
@click.argument("batch", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_cmd(batch: Path, as_json: bool) -> None:
    """Summarize a SetBatch file: events, set sizes, tokens, advantages, drops."""
    from rich.console import Console
    from rich.table import Table

    from srpo_graph.compiler.setbatch import SetBatch
    from srpo_graph.compiler.summary import summarize

    summary = summarize(SetBatch.load(batch))
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
        return
    table = Table(title=f"{batch}", show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("events (active sets)", summary.events), ("members (outputs)", summary.members),
        ("episodes", summary.episodes), ("tokens", summary.tokens), ("completion tokens", summary.completion_tokens),
        ("micro-batches", summary.micro_batches),
        ("real-token share (packed)", "100.0%"),
        ("real-token share (padded, TRL-style)", f"{100 * summary.real_token_share_padded:.1f}%"),
        ("advantage mean / std", f"{fixed(summary.advantage_mean, 4)} / {fixed(summary.advantage_std, 4)}"),
        ("advantage min / max", f"{fixed(summary.advantage_min, 4)} / {fixed(summary.advantage_max, 4)}"),
        ("advantage = 0 share", f"{100 * summary.advantage_zero_share:.1f}%"),
        ("policies", ", ".join(summary.policies)), ("transitions", ", ".join(summary.transitions)),
    ]
    for k in ("failed_episodes", "dropped_failed_episodes", "zeroed_failed_episodes", "truncated_episodes",
              "dropped_truncated_episodes", "penalized_truncated_episodes", "dropped_incomplete_events",
              "empty_events", "zero_variance_groups", "singleton_groups", "singleton_events",
              "dropped_zero_variance_events", "skipped_bad_lines"):
        rows.append((k.replace("_", " "), summary.stats.get(k, 0)))
    for k, v in rows:
        table.add_row(k, str(v))
    hist = Table(title="set sizes", show_header=True)
    hist.add_column("K", justify="right")
    hist.add_column("events", justify="right")
    hist.add_column("", justify="left")
    top = max(summary.set_size_histogram.values(), default=1)
    for size, n in summary.set_size_histogram.items():
        hist.add_row(str(size), str(n), "#" * max(1, round(30 * n / top)))
    console = Console()
    console.print(table)
    console.print(hist)


COMMANDS: list = [compile_cmd, inspect_cmd]
