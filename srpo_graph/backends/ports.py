"""TCP ports: one bound at once (the kernel's pick), or claimed for a process that binds it later.

Backends stage. A port the caller binds itself a moment later (a weight-sync group's store) is the
kernel's pick, :func:`free_port`. A port handed to a *child* that binds it only after its start-up
(an SGLang server binds ~20-30 s after its launch, a torchrun rendezvous a few seconds after) is
open to two races in that window, and :func:`claim_ports` closes both:

* **another launcher on this machine** (a second run, a second pytest-xdist worker) picking the same
  free port before the first child bound it: each handed-out port is *claimed* with an exclusive
  ``flock`` on ``<tmp>/srpo-graph-ports-<uid>/<port>.lock`` (one folder per user and temporary
  folder: the runs of one user on one machine see each other's claims), held by this process until
  :func:`release` or its exit (the kernel drops the lock of a dead process, so nothing goes stale);
  a claimed port is never handed out again, here or elsewhere;
* **an outgoing connection** taking the port as its local end: ports come from below the kernel's
  ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which connections never use, and
  outside 22000-29999, where SGLang 0.5.23 picks its own internal (nccl) port the same way (older
  releases took the HTTP port + 100..1000: a collision with a claimed port is then unlikely, not
  impossible).

A port a user names (``rollout.sglang.port``) is claimed too (:func:`claim`), so two runs given the
same port are told so before either launches a server.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
from pathlib import Path

#: where claimed ports come from when the ephemeral range leaves room: below SGLang's own pick range
#: (22000-29999, its nccl/dist ports) and above the well-known and registered-service crowd
CLAIM_RANGE = (12000, 21999)

_HELD: dict[int, int] = {}  # port -> fd of its lock file, for this process's claims
_GIVEN: set[int] = set()  # ports this process handed out and has not released (a child may still be starting)
_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick), for a socket the caller binds at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already binds ``host:port``."""
    with socket.socket() as sock:
        try:
            sock.bind((host, int(port)))
        except OSError:
            return True
    return False


def claims_dir() -> Path:
    """The folder of this user's port claims (one lock file per claimed port), this user's own.

    Raises:
        BackendError: the folder is not a directory of this user's that only they can write.
    """
    import stat

    from srpo_graph.errors import BackendError

    path = Path(tempfile.gettempdir()) / f"srpo-graph-ports-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise BackendError(f"{path}: the folder of port claims is not a directory of this user's that only they "
                           "can write (another user made it, or it is a link); remove it, or set TMPDIR")
    return path


def _claim_locked(port: int) -> bool:
    """Take the machine-wide lock of ``port`` (the caller holds ``_LOCK``); False: another process has it."""
    import errno
    import fcntl

    from srpo_graph.errors import BackendError

    folder = claims_dir()
    try:
        fd = os.open(folder / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise BackendError(f"{folder}: cannot open the claim of port {port} ({exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise BackendError(f"{folder}: cannot lock the claim of port {port} ({exc}; a file system without "
                           "flock?); set TMPDIR to a local folder") from None
    _HELD[port] = fd
    return True


def claim(port: int) -> bool:
    """Claim a port a user named for this process: True when it is now (or already was) this
    process's, False when another process holds it. The claim lasts until :func:`release` or this
    process's exit.

    Raises:
        BackendError: the claims folder cannot be used (:func:`claims_dir`, a file system without flock).
    """
    port = int(port)
    with _LOCK:
        return port in _HELD or _claim_locked(port)


def release(ports) -> None:
    """Drop this process's claims on ``ports`` (a port it never claimed is ignored)."""
    import fcntl

    with _LOCK:
        for port in ports:
            _GIVEN.discard(int(port))
            fd = _HELD.pop(int(port), None)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


def _claim_range() -> tuple[int, int]:
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    lo, hi = CLAIM_RANGE
    return lo, min(hi, ephemeral_low - 1)


def claim_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different ports, each free on ``host`` now and claimed for this process, for
    children that bind them later (see the module's docstring). Not one of them was handed out
    before by this process (unless released) or is claimed by another.

    Raises:
        BackendError: no free, unclaimed port is left in the range (a machine with thousands of
            servers starting at once), or the claims folder cannot be used.
    """
    from srpo_graph.errors import BackendError

    lo, hi = _claim_range()
    candidates = list(range(lo, hi + 1))
    if len(candidates) < 64:  # an ephemeral range that starts very low: only the kernel's pick is left
        candidates = []
    random.shuffle(candidates)
    out: list[int] = []

    def take(port: int) -> None:
        with _LOCK:  # checked and claimed in one step: two threads never take one port
            if port in _HELD or port in _GIVEN or port_in_use(port, host) or not _claim_locked(port):
                return
            _GIVEN.add(port)
        out.append(port)

    for port in candidates:
        if len(out) == count:
            break
        take(port)
    for _ in range(0 if candidates else 16 * count):  # fallback: the kernel's pick, claimed as well
        if len(out) == count:
            break
        take(free_port(host))
    if len(out) < count:
        release(out)
        raise BackendError(f"no {count} free, unclaimed ports on {host} in {lo}..{hi} (thousands of servers "
                           "starting at once?)")
    return out
