"""Release a session-scoped resource right after the last collected test that uses it, instead of
at the end of the session.

A session fixture that holds something costly while idle (a real SGLang server: its memory, and
the machine's 2 cores it competes for) registers a release with :func:`release_after_last_use`;
tests/conftest.py's ``pytest_runtest_teardown`` calls :func:`release_unused` after each test, which
releases what no later test of the run uses (by fixture name, in ``item.fixturenames``, which
holds every fixture a test needs, directly or through other fixtures' arguments -- not one
fetched with ``request.getfixturevalue``, which the release would miss). The fixture's own
finalizer should release it too (idempotently): a test selected with ``-k`` or a failure that
stops the run early still ends with nothing left running.
"""

from __future__ import annotations

from collections.abc import Callable

_RELEASES: dict[str, Callable[[], None]] = {}
_LAST: dict[str, int] = {}  # fixture name -> index of the last test of the run that uses it
_INDEX: dict[int, int] = {}  # id(item) -> its index in session.items


def release_after_last_use(fixture_name: str, release: Callable[[], None]) -> None:
    """Call ``release`` once the last test of the run that uses ``fixture_name`` is torn down."""
    _RELEASES[fixture_name] = release


def release_unused(item) -> None:
    """Release what no test after ``item`` uses (the teardown hook of tests/conftest.py)."""
    if not _RELEASES:
        return
    items = item.session.items
    if len(_INDEX) != len(items):
        _INDEX.clear()
        _LAST.clear()
        for i, it in enumerate(items):
            _INDEX[id(it)] = i
            for name in getattr(it, "fixturenames", ()):
                _LAST[name] = i
    here = _INDEX.get(id(item))
    for name in list(_RELEASES):
        if here is not None and here >= _LAST.get(name, -1):
            _RELEASES.pop(name)()
