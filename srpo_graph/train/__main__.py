"""``python -m srpo_graph.train FILE.wf ...`` (what torchrun runs as each rank).

The same arguments as ``srpo-graph train``; errors are printed without a traceback and exit
with the error class's code. A rank works in a child of its process, which names user code that
ends it (``srpo_graph/supervisor.py``). torchrun runs this file as a new interpreter
(``-m srpo_graph.train``, ``SRPO_GRAPH_RANK_START=exec``) or, by default, in a process forked from
its preloaded forkserver (``--run-path``: Note [Ranks forked from a preloaded server],
``train/parallel/forked.py``).
"""

from __future__ import annotations

import sys
import traceback

from srpo_graph import exiting, supervisor
from srpo_graph.errors import SrpoGraphError


def main(argv: list[str] | None = None) -> None:
    from srpo_graph.train.commands import train_command
    from srpo_graph.train.parallel.launch import stop_with_parent

    stop_with_parent()  # a rank under the launcher's torchrun stops when torchrun is gone

    code = 1
    try:
        _run(train_command, argv)
        code = 0
    except SystemExit as exc:
        code = supervisor.exit_status(exc.code)
        raise
    except BaseException:
        if exiting.ends_without_finalizing():  # (exiting.end below skips Python's own printing of it)
            traceback.print_exc()
        raise
    finally:  # the outcome is decided: a signal must not raise into the exit (srpo_graph/exiting.py)
        exiting.decided()
        supervisor.finished(code)
        exiting.end(code)  # a rank ends here, without finalizing (Note [A process in a group ends without finalizing])


def _run(train_command, argv: list[str] | None) -> None:
    try:
        train_command.main(args=argv if argv is not None else sys.argv[1:], prog_name="srpo_graph.train",
                           standalone_mode=False)
    except SrpoGraphError as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


def _supervise() -> None:
    """A rank runs in a child of its own process, so that user code ending it is named and is a failure
    torchrun sees (supervisor.py, Note [User code that ends the process]); the parent watches torchrun."""
    import os

    rank = os.environ.get("RANK")
    supervisor.supervise(f"train (rank {rank})" if rank else "train", watch_parent=_torchrun())


def _torchrun() -> int | None:
    """The pid of the torchrun that started this rank, which it watches (Note [Parent death]); the
    variable is removed, so that the rank's own children do not watch it."""
    import os

    from srpo_graph.train.parallel.launch import PARENT_ENV

    watched = os.environ.pop(PARENT_ENV, "")
    return int(watched) if watched.isdigit() else None


if __name__ == "__main__":
    import multiprocessing

    if multiprocessing.parent_process() is not None:  # torchrun's --run-path, in a forked rank
        from srpo_graph.train.parallel import forked

        forked.rank(main, sys.argv[1:], torchrun=_torchrun())
    _supervise()
    exiting.as_entry_point()
    main()
