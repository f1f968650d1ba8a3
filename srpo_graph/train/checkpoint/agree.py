"""Trainer stage, checkpoints: every rank of a job leaves a save the same way (:func:`agree`).

Consumes each rank's outcome of one part of a save (None, or what it raised); produces the same
outcome on every rank: nothing, or the same stop -- a full disk anywhere is :class:`DiskFull` on
every rank, whatever each rank met itself. One process: the outcome as it is.

Note [A full disk stops every rank]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A checkpoint save under torchrun is written by several processes: under fsdp every rank writes
its DCP shards (and rank 0 the rest), under ddp rank 0 writes the whole checkpoint while the
others wait. The disk fills up on one of them -- or on several, each meeting it as another error
(torch's zip writer says "unexpected pos", DCP wraps it in a CheckpointException naming the
rank) -- and a rank that did not meet it must not go on into the next step's collective (a hang
until ``dist_timeout``, then a second, misleading stop) nor stop with a traceback of its own.
So each part of a save ends in :func:`agree`, one collective under the group's deadline:

* each rank says what it met: nothing, a full disk (``layout.disk_full``: ENOSPC anywhere in the
  chain, a library's own words for it, or under 1 MiB left -- judged *before* anything is removed,
  and what ``layout.disk_full_reason`` says about it there: the file, the bytes left on that file
  system), or another error;
* if any rank failed, every rank removes its copy of the half-written ``.tmp-`` folder, then a
  barrier, so no rank exits (and torchrun stops the others) while the folder is still there;
* every rank raises the same :class:`DiskFull` (an ``OSError`` ENOSPC carrying the first full
  rank's words, naming that rank when it is not rank 0): the loop turns it into ``RunStopped``
  on every rank (exit 1, the single-process code), and only rank 0 prints it -- one message naming
  the full disk, the newest complete checkpoint and the resume command (``stops.py``);
* another error: the rank that met it raises it, the others a ConfigError naming that rank.

The earlier checkpoints are never touched (only the ``.tmp-`` folder is removed), so ``--resume``
continues once there is space. Tested on a real small tmpfs: tests/train/test_disk_full.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Sequence

from srpo_graph.errors import ConfigError
from srpo_graph.train.checkpoint.layout import disk_full, disk_full_reason
from srpo_graph.train.parallel.collectives import all_gather_bytes, all_reduce, current


class DiskFull(OSError):
    """The disk filled up during a save on some rank of the job, as every rank raises it: an
    ``OSError`` ENOSPC whose ``reason`` is what the rank that met it said (``layout.disk_full_reason``).

    >>> e = DiskFull("No space left on device (/x; 0 bytes free on that file system)", "/x")
    >>> e.errno == errno.ENOSPC, e.reason.split(" (")[0]
    (True, 'No space left on device')
    """

    def __init__(self, reason: str, filename: str):
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        self.reason = reason


def as_disk_full(exc: BaseException, final: Path) -> OSError:
    """``exc`` (a full disk) as an ``OSError`` ENOSPC naming its file: the first such error in its
    chain, else one naming the checkpoint being written (``final``), as ``layout.failed`` does.

    >>> as_disk_full(RuntimeError("unexpected pos 704 vs 598"), Path("ck/step_2")).filename
    'ck/step_2'
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT) and seen.filename:
            return seen
        seen = seen.__cause__ or seen.__context__
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))


def _failure(error: BaseException | None) -> bool:
    """``error`` is a failure of the save, not a signal or an exit (DCP's CheckpointException is a
    BaseException: it counts).

    >>> _failure(RuntimeError("x")), _failure(KeyboardInterrupt()), _failure(None)
    (True, False, False)
    """
    return error is not None and not isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit))


def agree(error: BaseException | None, run_dir: str | Path, final: Path, *, remove: Sequence[Path] = ()) -> None:
    """Every rank's ``error`` (None: its part went well) of one part of the save of ``final``
    (``run_dir/checkpoints/step_N``) becomes the same outcome on every rank (Note [A full disk
    stops every rank]); a collective under the group's deadline. One process: ``error`` is raised
    (a full disk as an ``OSError`` ENOSPC). On failure, ``remove`` (the ``.tmp-`` folder) is gone on
    every rank before any rank leaves.

    Raises:
        DiskFull: some rank's disk filled up.
        BaseException: this rank's own ``error``, when no disk filled up.
        ConfigError: another rank failed (not a full disk); its output says why.
    """
    info = current()
    root = Path(run_dir) / "checkpoints"
    if not info.enabled:
        if error is None:
            return
        for path in remove:
            shutil.rmtree(path, ignore_errors=True)
        if _failure(error) and not isinstance(error, OSError) and disk_full(error, root):
            raise as_disk_full(error, final) from error  # a library's own words for it, as layout.failed
        raise error
    said = b""
    if error is not None and _failure(error) and disk_full(error, root):  # judged before anything is removed
        said = json.dumps({"full": disk_full_reason(as_disk_full(error, final), root),
                           "host": socket.gethostname()}).encode()
    elif error is not None:
        said = json.dumps({"error": f"{type(error).__name__}: {str(error)[:300]}"}).encode()
    outcomes = [(rank, json.loads(o)) for rank, o in enumerate(all_gather_bytes(said, info)) if o]
    if not outcomes:
        return
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    all_reduce(0, "max", info)  # a barrier: the .tmp- folder is gone before any rank leaves
    full = [(rank, o) for rank, o in outcomes if "full" in o]
    if full:
        rank, o = full[0]
        where = f" [rank {rank}, on {o['host']}]" if rank != 0 else ""
        raise DiskFull(o["full"] + where, str(final)) from None
    if error is not None:
        raise error
    rank, o = outcomes[0]
    raise ConfigError.at(str(run_dir), f"rank {rank} could not write its part of checkpoint {final.name} "
                         f"({o['error']})", fix="see that rank's output")


__all__ = ["DiskFull", "agree", "as_disk_full"]
