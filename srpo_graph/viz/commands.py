"""CLI command of the viz stage: ``viz`` (registered by ``srpo_graph.cli``)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("viz")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Output file: .svg, .png, .dot or .mmd (Mermaid).")
@click.option("--layout", "engine", type=click.Choice(["auto", "grandalf", "dot"]), default="auto", show_default=True,
              help="Layout of an SVG/PNG picture: Graphviz's dot when on PATH (auto), else grandalf (pure Python).")
def viz_cmd(file: Path, output: Path, engine: str) -> None:
    """Draw the routing graph of FILE into OUTPUT (format from its suffix)."""
    from srpo_graph.lang import load_workflow
    from srpo_graph.viz import write_graph

    workflow = load_workflow(file)
    write_graph(workflow, output, engine)
    click.echo(f"wrote {output}")


COMMANDS: list = [viz_cmd]
