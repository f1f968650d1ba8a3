"""CLI commands of the lang stage: ``check`` and ``fmt`` (registered by ``srpo_graph.cli``).

Each command runs one stage on ``.wf`` files and raises the project's errors (the CLI maps them
to exit codes and prints them without a traceback). Heavy imports (matplotlib) stay inside the
functions so ``srpo-graph check`` starts fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from srpo_graph.errors import SrpoGraphError, WorkflowCheckError, render


@click.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "json_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also save each checked Workflow as DIR/<name>.json (the typed spec later stages read).")
@click.option("--no-import", "no_import", is_flag=True, default=False,
              help="Import no module but std: check everything except the called functions' signatures "
                   "and return types (runs none of the file's Python code).")
@click.option("--allow-import", "allow_import", multiple=True, metavar="MODULE",
              help="Only these modules may be imported (repeatable; `pkg.*` allows a package). "
                   "Default: $SRPO_GRAPH_ALLOWED_IMPORTS (comma-separated), else any.")
@click.option("--no-tokens", "no_tokens", is_flag=True, default=False,
              help="Skip the token check (allow entries and prompt text against each local tokenizer).")
def check_cmd(files: tuple[Path, ...], json_dir: Path | None, no_import: bool, allow_import: tuple[str, ...],
              no_tokens: bool) -> None:
    """Parse and type-check FILES; print a summary of each workflow (exit 2 on errors).

    A .wf file is code: `check` (like `viz`, `run` and `train`) imports the Python modules the
    file names, which runs their code. Use --no-import or --allow-import on files you do not trust.

    For policies whose tokenizer is local ("tiny", a model folder), `allow` entries must be single
    tokens (an error) and prompt text unknown to the tokenizer is a warning.
    """
    from srpo_graph.lang.checker import ImportPolicy, check_module
    from srpo_graph.lang.parser import parse, read_source
    from srpo_graph.lang.summary import summary

    policy = ImportPolicy.from_env()
    if allow_import:
        policy = ImportPolicy(allowed=tuple(allow_import))
    if no_import:
        policy = ImportPolicy(allowed=policy.allowed, no_import=True)
    check_tokens = None if no_tokens else (click.get_current_context().obj or {}).get("check_tokens")
    failures: list[SrpoGraphError] = []
    shown = 0
    for path in files:
        try:
            text = read_source(path)
            result = check_module(parse(text, str(path)), text, imports=policy)
        except SrpoGraphError as exc:
            failures.append(exc)
            continue
        token_diags = check_tokens(result.workflow) if check_tokens is not None else []
        if any(d.severity == "error" for d in token_diags):
            failures.append(WorkflowCheckError(diagnostics=token_diags + result.warnings, source=text))
            continue
        warnings = result.warnings + token_diags
        if warnings:
            click.echo(render(warnings, text), err=True)
        if shown:
            click.echo()  # a blank line between workflows
        click.echo(summary(result.workflow, result.max_firings, result.bound_reason))
        skipped = [i.alias for i in result.workflow.imports if policy.no_import and i.module != "srpo_graph.std"]
        if skipped:
            click.echo(f"  not imported: {', '.join(skipped)} (--no-import: their functions' signatures are unchecked)")
        shown += 1
        if json_dir is not None:
            json_dir.mkdir(parents=True, exist_ok=True)
            out = json_dir / f"{result.workflow.name}.json"
            out.write_text(result.workflow.model_dump_json(indent=2) + "\n", encoding="utf-8")
            click.echo(f"  saved:       {out}")
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise WorkflowCheckError(
            "\n".join(str(f) for f in failures) + f"\n{len(failures)} of {len(files)} files failed"
        )


@click.command("fmt")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if a file is not formatted; change nothing.")
@click.option("--write", "-w", is_flag=True, help="Rewrite the files in place (default: print to stdout).")
def fmt_cmd(files: tuple[Path, ...], check_only: bool, write: bool) -> None:
    """Print FILES in canonical form (or --write them, or --check them)."""
    from srpo_graph.lang.fmt import format_source
    from srpo_graph.lang.parser import read_source

    unformatted = []
    for path in files:
        text = read_source(path)
        out = format_source(text, str(path))
        if check_only:
            if out != text:
                unformatted.append(path)
                click.echo(f"{path}: would reformat", err=True)
        elif write:
            if out != text:
                path.write_text(out, encoding="utf-8")
                click.echo(f"{path}: reformatted", err=True)
        else:
            click.echo(out, nl=False)
    if unformatted:
        raise click.exceptions.Exit(1)


COMMANDS: list = [check_cmd, fmt_cmd]
