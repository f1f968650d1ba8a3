"""The ``srpo-graph`` command: one subcommand per pipeline stage.

Each stage defines its click commands in its own ``commands.py``; this module lists them in
pipeline order (no registry filled at import time). A :class:`~srpo_graph.errors.SrpoGraphError`
is printed as its rendered message, without a traceback, and the process exits with the
error class's code (2 for workflow errors, see ``srpo_graph.errors``); Ctrl-C in any command is
one line (the command's own, :class:`~srpo_graph.exiting.Interrupted`, else ``srpo-graph CMD:
interrupted``) and exit 130, as ``train`` does. The commands that run user code (:data:`SUPERVISED`)
work in a forked child whose death outside srpo-graph is named (``supervisor.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

from srpo_graph import supervisor


def _interrupted_while_starting(signum, frame):  # noqa: ARG001 - a signal handler's signature
    """Ctrl-C / SIGTERM while the command's modules are still importing: one line, no traceback."""
    os.write(2, b"srpo-graph: interrupted while starting; nothing was done\n")
    supervisor.finished(128 + signum)
    os._exit(128 + signum)


# the commands that run a workflow's Python (rewards, tools, extractors, its modules' imports)
SUPERVISED = ("run", "train", "eval", "check", "viz", "show")


def _subcommand(argv: list[str]) -> str | None:
    """The subcommand of a command line (the group's only options are flags: --help, --version).

    >>> _subcommand(["--version"]), _subcommand(["train", "a.wf"])
    (None, 'train')
    """
    return next((a for a in argv if not a.startswith("-")), None)


# the console script (or `python -m srpo_graph.cli`): a signal in the first fraction of a second,
# while click, pydantic and the stages import, must not print an import traceback (issue 23, item 4);
# `main` puts Python's handlers back before the command runs. Importing this module from Python
# (tests, notebooks) changes no handler.
_AS_COMMAND = __name__ == "__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "srpo-graph"
if _AS_COMMAND:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    signal.signal(signal.SIGTERM, _interrupted_while_starting)
if _AS_COMMAND and _subcommand(sys.argv[1:]) in SUPERVISED:
    # Note [User code that ends the process] (supervisor.py): the parent waits here and never returns
    supervisor.supervise(str(_subcommand(sys.argv[1:])))

import click  # noqa: E402 - after the start-up handlers

from srpo_graph import exiting  # noqa: E402
from srpo_graph.errors import SrpoGraphError  # noqa: E402


class _Group(click.Group):
    def invoke(self, ctx: click.Context):  # one place turns our errors and Ctrl-C into exit codes
        try:
            return super().invoke(ctx)
        except SrpoGraphError as exc:
            click.echo(str(exc), err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:  # (click would print "Aborted!" and exit 1)
            exiting.decided()
            said = str(exc) if isinstance(exc, exiting.Interrupted) and str(exc) else None
            command = f"srpo-graph {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "srpo-graph"
            click.echo(said or f"{command}: interrupted", err=True)
            ctx.exit(128 + (exiting.stopped_by() or signal.SIGINT))


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
    from srpo_graph.runtime import show_commands as show_cmds
    from srpo_graph.train import commands as train_cmds
    from srpo_graph.viz import commands as viz_cmds

    for module in (lang_cmds, viz_cmds, runtime_cmds, show_cmds, compiler_cmds, train_cmds, lsp_cmds):
        for cmd in module.COMMANDS:
            app.add_command(cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    if _AS_COMMAND:  # the commands handle Ctrl-C / SIGTERM themselves from here on
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        exiting.as_entry_point()
    code = 1
    try:
        app.main(args=argv, prog_name="srpo-graph")
    except SystemExit as exc:  # (click's standalone mode always ends so)
        code = supervisor.exit_status(exc.code)
        raise
    except BaseException:  # a bug's traceback: Python's exit status 1
        if exiting.ends_without_finalizing():  # (exiting.end below skips Python's own printing of it)
            traceback.print_exc()
        raise
    finally:  # the outcome is decided: a signal must not raise into the exit (exiting.py)
        exiting.decided()
        supervisor.finished(code)
        # exiting.py: Note [A process in a group ends without finalizing], Note [A daemon thread at finalization]
        exiting.end(code)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
