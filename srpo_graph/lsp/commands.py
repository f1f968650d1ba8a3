"""CLI command of the lsp stage: ``lsp`` (registered by ``srpo_graph.cli``)."""

from __future__ import annotations

import click

from srpo_graph.errors import ConfigError


@click.command("lsp")
@click.option("--stdio", is_flag=True, default=True, help="Talk LSP over stdin/stdout (the only transport; "
              "accepted because editors often pass it).")
def lsp_cmd(stdio: bool) -> None:
    """Run the language server of .wf files over stdio (for editors; see docs/editor.md).

    Diagnostics are `check`'s (imports off unless the editor's settings turn them on), plus
    hover, go to definition, references, completion, rename, outline and formatting (`fmt`).
    """
    try:
        import pygls  # noqa: F401
    except ImportError:
        raise ConfigError.at("srpo-graph lsp", "the language server needs pygls, which is not installed",
                             fix='pip install "srpo-graph[lsp]"') from None
    from srpo_graph.lsp import serve

    code = serve()
    if code:
        raise click.exceptions.Exit(code)
    # (the warm-up threads may still be importing: the CLI ends the process without finalizing,
    # Note [A daemon thread at finalization] in srpo_graph/exiting.py)


COMMANDS: list = [lsp_cmd]
