"""A real full disk: a small tmpfs mounted in a user+mount namespace (``unshare -rm``), no root needed.

:func:`tmpfs_command` is the argv that mounts a tmpfs of a given size on a folder and runs shell
commands there (each process started with it sees its own tmpfs, the rest of the machine as it
is: the network too, so torchrun's ranks and nodes still meet); :func:`on_tmpfs` runs it to its
end. Sizes are counted in pages (:func:`pages`), as tmpfs counts them. :data:`needs_tmpfs` skips
a test where namespaces are not allowed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Iterable

import pytest

PAGE = 4096


def pages(n: int) -> int:
    """The pages of tmpfs a file of ``n`` bytes takes.

    >>> pages(0), pages(1), pages(4096), pages(4097)
    (0, 1, 1, 2)
    """
    return -(-n // PAGE)


def pages_of(files: Iterable[Path]) -> int:
    """The pages the regular files ``files`` take."""
    return sum(pages(p.stat().st_size) for p in files if p.is_file())


@functools.cache
def can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not can_mount(),
                                 reason="needs user+mount namespaces (unshare -rm) to mount a small tmpfs")


def tmpfs_command(mnt: Path, size: int | str, commands: str) -> list[str]:
    """The argv that mounts a tmpfs of ``size`` (bytes, or tmpfs's own ``8m``) on ``mnt`` in a new
    user+mount namespace, then runs ``commands`` (sh) there; its exit status is theirs."""
    return ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {mnt} && {commands}"]


def on_tmpfs(mnt: Path, size: int | str, commands: str, *, cwd: Path, env: dict[str, str],
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run :func:`tmpfs_command` to its end, its output captured."""
    return subprocess.run(tmpfs_command(mnt, size, commands), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
