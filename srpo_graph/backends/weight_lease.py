"""Backends stage: the lease that makes one owner at a time of a weight folder (``weight_dir.py``).

Note [A weight folder's lease]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The weight folder is often on a file system several hosts share (the servers read it), so who
owns it cannot be decided by a PID (before: an owner on another host counted as dead, and a
second run rewrote the first run's live weights; a second owner in the same process was not
refused either). The owner holds a lease instead: ``<folder>/.srpo-graph-lease.json`` records
the run, host, pid, a token of its own (one per :class:`Lease` object) and a heartbeat time that
a daemon thread renews every ``interval`` seconds (and every write renews too).

* Taking it: the record is written to a temporary file and hard-linked to the lease's name
  (``os.link`` fails if the name exists: an atomic create with the content complete, on NFS too;
  no flock, whose semantics across hosts differ).
* A lease held by another token is refused while its heartbeat is younger than the expiry the
  holder recorded (``expiry``, several intervals: default 10 s and 60 s), naming its run, host,
  pid and the heartbeat's age -- another process, another host, and another object in this
  process alike.
* Past its expiry (the holder stopped without closing: killed, its host gone) it is taken over
  with a one-line warning: the stale lease is renamed to a name of the taker's own, then the new
  lease is linked in. Takers racing for one stale lease are serialised by a marker named after
  that lease file's identity (inode and content), created exclusively: only its creator may move
  that file, and it first checks that the lease's name still holds that very file. (Before: a
  taker that judged the old lease stale could rename away the lease another taker had just
  linked in, and with a third creating one in between, two held the folder -- seen once in eight
  threads racing under load.) A marker left by a taker that died in those few instructions is
  removed once older than ``MARKER_STALE_S``.
* The same run in another process on the same host is not a second owner: the run folder's lock
  admits one process per run, so it is the run resumed after its previous process died; it takes
  over at once. (From another host it waits for the expiry: two hosts may have run folders of the
  same path, hence the same owner id, that are not the same folder.)
* A holder that finds its lease taken over (its heartbeat stopped past the expiry: a process
  suspended that long) refuses its next write instead of writing over the new owner's folder.
* :meth:`Lease.release` (the backend's ``close``, and ``server_scope`` at the end of a run)
  removes the lease if it is still this holder's.

Hosts sharing a folder are assumed to have clocks within a few seconds of each other (NTP); the
expiry of several intervals absorbs that and a slow file system.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from srpo_graph.errors import BackendError

LEASE = ".srpo-graph-lease.json"
HEARTBEAT_S = 10.0  # how often the holder renews its lease
EXPIRY_S = 60.0  # a heartbeat older than this: the holder is gone (6 intervals)
MARKER_STALE_S = 30.0  # a take-over marker this old was left by a taker that died while taking over
LOOK_S = 10.0  # how long acquire looks again while the lease keeps changing under it

_LIVE: "weakref.WeakSet[Lease]" = weakref.WeakSet()  # leases held by this process (release_all)


class WeightFolderError(BackendError):
    """The weight folder cannot be used as it is (another run owns it, a folder srpo-graph did not
    write is in the way); no server is at fault."""

    remedy = "fix the weight folder as said above"


class Lease:
    """One holder's lease on ``root`` (Note [A weight folder's lease]).

    Args:
        root: the weight folder.
        owner: the owner id (a run's: ``weight_dir.run_owner``).
        run: what the lease names as its run (the run folder, else the owner id).
        interval, expiry: seconds between heartbeats, and the age past which a heartbeat is stale.
    """

    def __init__(self, root: str | os.PathLike, owner: str, run: str | None = None, *,
                 interval: float = HEARTBEAT_S, expiry: float = EXPIRY_S):
        if not 0 < interval < expiry:
            raise ValueError(f"a lease needs 0 < interval < expiry (got {interval}, {expiry})")
        self.root, self.owner, self.run = Path(root), owner, run or owner
        self.interval, self.expiry = float(interval), float(expiry)
        self.token = secrets.token_hex(8)
        self.held = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the heartbeat thread and a write renew through one temporary file
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return self.root / LEASE

    def _record(self) -> dict[str, Any]:
        return {"run": self.run, "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                "token": self.token, "heartbeat": time.time(), "interval": self.interval, "expiry": self.expiry}

    def _read(self) -> tuple[dict[str, Any] | None, float | None, str | None]:
        """The lease on disk, the age of its heartbeat and the identity of the file read
        (:func:`_identity`); (None, the file's age, identity): unreadable; (None, None, None): no lease.
        An age below 0 is a holder whose clock runs ahead: fresh."""
        try:
            st, text, ident = _identity(self.path)
        except FileNotFoundError:
            return None, None, None
        try:
            data = json.loads(text)
            beat = float(data["heartbeat"])
            if isinstance(data, dict):
                return data, time.time() - beat, ident
            return None, time.time() - st.st_mtime, ident
        except (ValueError, KeyError, TypeError):
            return None, time.time() - st.st_mtime, ident

    def _tmp(self) -> Path:
        tmp = self.root / f"{LEASE}.{self.token}.tmp"
        tmp.write_text(json.dumps(self._record()))
        return tmp

    def _create(self) -> bool:
        """Link a complete lease in under its name; False: one is there."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            tmp = self._tmp()
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)

    def acquire(self) -> None:
        """Hold the lease (renew it if held).

        Raises:
            WeightFolderError: another holder's lease is fresh, or this holder's was taken over.
        """
        if self.held:
            self.renew()
            return
        deadline = time.monotonic() + LOOK_S  # a lease that vanishes or is taken over between two looks: look again
        while time.monotonic() < deadline:
            if self._create():
                self._hold()
                return
            data, age, ident = self._read()
            if age is None:
                continue  # released in between
            if data is not None and data.get("token") == self.token:
                self._hold()
                return
            expiry = _num(data.get("expiry"), EXPIRY_S) if data else EXPIRY_S
            resumed = (data is not None and data.get("owner") == self.owner and data.get("pid") != os.getpid()
                       and data.get("host") == socket.gethostname())  # this run's previous process, here
            if age < expiry and not resumed:
                raise self._refusal(data, age)
            marker = self.root / f"{LEASE}.{ident}.takeover"
            try:  # only the taker that makes this marker may move this very file
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                _clear_if_stale(marker)
                time.sleep(0.01)  # another taker is replacing it: look again when it is done
                continue
            try:
                if self._take_over(ident):
                    if not resumed:
                        print(f"srpo-graph: weight folder {self.root}: taking over the lease of {_holder(data)}: "
                              f"last heartbeat {age:.0f}s ago (expiry {expiry:g}s)", file=sys.stderr)
            finally:
                marker.unlink(missing_ok=True)
        raise WeightFolderError.at(str(self.path), "could not take the weight folder's lease (it kept changing)",
                                   fix="make sure one run at a time uses this rollout.sglang.weight_dir")

    def _take_over(self, ident: str | None) -> bool:
        """Move the stale lease file ``ident`` out of the lease's name (the caller holds its marker);
        False: the name holds another file by now (left as it is, or put back)."""
        if self._read()[2] != ident:  # renewed, released or replaced since it was judged stale
            return False
        moved = self.root / f"{LEASE}.{self.token}.stale"
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return False
        try:
            if _identity(moved)[2] != ident:  # its holder renewed it in that instant: put it back
                try:
                    os.link(moved, self.path)
                except FileExistsError:
                    pass  # (its holder finds out at its next renewal, before any write)
                return False
            return True
        finally:
            moved.unlink(missing_ok=True)

    def _refusal(self, data: dict[str, Any] | None, age: float) -> WeightFolderError:
        expiry = _num(data.get("expiry"), EXPIRY_S) if data else EXPIRY_S
        return WeightFolderError.at(
            str(self.root), f"the weight folder is in use by another run ({_holder(data)}; last heartbeat "
            f"{age:.1f}s ago, stale after {expiry:g}s; {self.path})",
            why="two runs sharing a weight folder would delete each other's live versions",
            fix="give each run its own rollout.sglang.weight_dir (the default, RUN_DIR/weights, is)")

    def _hold(self) -> None:
        self.held = True
        _LIVE.add(self)
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"weight-lease {self.root.name}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except WeightFolderError:
                return  # lost: the next write says so
            except OSError:
                continue  # a file system hiccup: the next beat tries again

    def renew(self) -> None:
        """A new heartbeat.

        Raises:
            WeightFolderError: the lease is no longer this holder's (taken over after its expiry).
        """
        with self._lock:
            self._renew()

    def _renew(self) -> None:
        data, _, _ = self._read()
        if data is None or data.get("token") != self.token:
            self.held = False
            self._stop.set()
            raise WeightFolderError.at(
                str(self.root), "this run's lease on the weight folder was taken over "
                f"({_holder(data) if data else 'no lease'}): its heartbeat stopped for more than {self.expiry:g}s",
                why="another run may be writing there now",
                fix="give each run its own rollout.sglang.weight_dir; resume this run")
        self._tmp().replace(self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still this holder's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.held:
            self.held = False
            data, _, _ = self._read()
            if data is not None and data.get("token") == self.token:
                self.path.unlink(missing_ok=True)
        _LIVE.discard(self)


def held() -> set[int]:
    """The ids of the leases this process holds now (for :func:`release_all`'s ``keep``)."""
    return {id(lease) for lease in _LIVE}


def release_all(keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Release every lease this process holds but those in ``keep`` (the end of a run:
    ``rollout.backends.server_scope``)."""
    for lease in list(_LIVE):
        if id(lease) not in keep:
            lease.release()


def _identity(path: Path) -> tuple[os.stat_result, str, str]:
    """A lease file's stat, text and identity: its inode and a digest of its content, read from one open
    file. Not the mtime: a new lease can reuse a removed one's inode within one coarse mtime tick; every
    lease's content differs (its own token and heartbeat)."""
    fd = os.open(path, os.O_RDONLY)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        raw = f.read()
    return st, raw.decode("utf-8", errors="replace"), f"{st.st_ino}-{hashlib.sha256(raw).hexdigest()[:16]}"


def _clear_if_stale(marker: Path) -> None:
    """Remove a take-over marker left by a taker that died while taking over."""
    try:
        if time.time() - marker.stat().st_mtime > MARKER_STALE_S:
            marker.unlink(missing_ok=True)
    except FileNotFoundError:
        pass


def _num(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _holder(data: dict[str, Any] | None) -> str:
    if data is None:
        return "an unreadable lease"
    return f"run {data.get('run')}, host {data.get('host')}, process {data.get('pid')}"


__all__ = ["EXPIRY_S", "HEARTBEAT_S", "LEASE", "Lease", "WeightFolderError", "held", "release_all"]
