"""The ``srpo-graph`` command: one subcommand per pipeline stage.

Each stage defines its click commands in its own ``commands.py``; this module lists them in
pipeline order (no registry filled at import time). A :class:`~srpo_graph.errors.SrpoGraphError`
is printed as its rendered message, without a traceback, and the process exits with the
error class's code (2 for workflow errors, see ``srpo_graph.errors``).
"""

from __future__ import annotations

import sys

import click

from srpo_graph.errors import SrpoGraphError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):  # one place turns our errors into exit codes
        try:
            return super().invoke(ctx)
        except SrpoGraphError as exc:
            click.echo(str(exc), err=True)
            ctx.exit(exc.exit_code)


def _check_tokens(workflow):
    """`check`'s token rule (issue 12): it needs the backends' tokenizers, a later stage than
    lang, so the composition root hands it to the lang command through the click context."""
    from srpo_graph.runtime.tokens import check_local_tokens

    return check_local_tokens(workflow)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "obj": {"check_tokens": _check_tokens}})
@click.version_option(package_name="srpo-graph")
def app() -> None:
    """Declare multi-agent LLM workflows as typed graphs and train them with SRPO."""


def _register() -> None:
    from srpo_graph.compiler import commands as compiler_cmds
    from srpo_graph.lang import commands as lang_cmds
    from srpo_graph.lsp import commands as lsp_cmds
    from srpo_graph.runtime import commands as runtime_cmds
    from srpo_graph.train import commands as train_cmds
    from srpo_graph.viz import commands as viz_cmds

    for module in (lang_cmds, viz_cmds, runtime_cmds, compiler_cmds, train_cmds, lsp_cmds):
        for cmd in module.COMMANDS:
            app.add_command(cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    app.main(args=argv, prog_name="srpo-graph")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
