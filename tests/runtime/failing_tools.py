"""Tools the executor tests import by module name (like a user's ``import my_tools``)."""

from __future__ import annotations

import time


def note(a: int, target: int) -> str:
    """A slow, well-behaved tool: the other episodes must keep generating meanwhile."""
    time.sleep(0.01)
    return f"{a}+{target}"


def explode_on_3(a: int, target: int) -> str:
    """Raises for target 3 only: that task's episodes fail, the others succeed."""
    if target == 3:
        raise RuntimeError("tool broke on purpose")
    return f"ok{target}"
