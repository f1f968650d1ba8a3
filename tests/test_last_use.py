"""tests/support/last_use.py: a shared session resource (a real SGLang server) is released right
after the last test of the run that uses it, once, and not before."""

from __future__ import annotations

from types import SimpleNamespace

from tests.support import last_use


def test_a_resource_is_released_after_its_last_user_and_only_then(monkeypatch):
    for name in ("_RELEASES", "_INDEX", "_LAST"):  # this run's own registrations are left alone
        monkeypatch.setattr(last_use, name, {})
    session = SimpleNamespace(items=[])
    uses = [("a",), (), ("b", "a"), ("b",), ()]
    session.items = [SimpleNamespace(session=session, fixturenames=names) for names in uses]
    released = []
    last_use.release_after_last_use("a", lambda: released.append("a"))
    last_use.release_after_last_use("b", lambda: released.append("b"))
    seen = []
    for item in session.items:
        last_use.release_unused(item)
        seen.append(list(released))
    assert seen == [[], [], ["a"], ["a", "b"], ["a", "b"]]
