"""How the suite is split over pytest-xdist workers (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``).

Most tests train or sample on one torch thread (models/__init__.py, Note [Threads for small
models]), so on a 2-core machine one pytest process leaves a core idle most of the time; two
workers fill it (docs/performance.md, "CI time"). What must not be split:

* the tests that use a session's shared real SGLang server (``sglang_url``, ``local_sglang``): in one
  worker, so the server starts once (a start is ~20-30 s and ~1 GB); the real-server tests that
  launch servers of their own (``rollout.sglang.launch=cpu``) run on either worker;
* the tests that compare N processes with the session's one-process reference run
  (``one_process``, tests/support/reference_runs.py): in one worker, so it trains once;
* each file that shares a module-scoped fixture trained once (a reference run, a trained
  checkpoint): xdist's ``loadgroup`` keeps a group on one worker, so the fixture is built once.

Other tests are distributed one by one.
"""

from __future__ import annotations

import pytest

SGLANG_GROUP = "sglang"
SESSION_SERVERS = {"sglang_url", "local_sglang"}
SHARED_SESSION = {"one_process": "one-process"}  # a costly session fixture -> its group
_SHARED_SCOPES = ("module", "class", "package")


def _uses_shared_fixture(item) -> bool:
    """Whether ``item`` needs a module-, class- or package-scoped fixture of its own test files (one a
    second worker would build again)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name) or ()
        if defs and defs[-1].scope in _SHARED_SCOPES:
            return True
    return False


def group_of(item) -> str | None:
    """The xdist group ``item`` belongs to (None: it can run on any worker)."""
    if SESSION_SERVERS & set(getattr(item, "fixturenames", ())):
        return SGLANG_GROUP
    for name, group in SHARED_SESSION.items():
        if name in getattr(item, "fixturenames", ()):
            return group
    if _uses_shared_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


def group_items(items) -> None:
    """Mark each item with its xdist group (a no-op without ``--dist loadgroup``)."""
    for item in items:
        group = group_of(item)
        if group is not None and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
