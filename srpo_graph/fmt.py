"""How numbers are printed to people (a shared helper: every stage may import it, it imports none).

A value that rounds to zero prints as zero, never ``-0.000`` (issue 39, item 7: ``eval`` printed
``-0.000`` for a mean of tiny negative rewards, ``compile`` ``-0.0000`` for an advantage mean that is
zero up to float error): the sign of a number too small to show is noise, not information.
"""

from __future__ import annotations

import math


def fixed(x: float, digits: int = 3, *, signed: bool = False) -> str:
    """``x`` with ``digits`` decimals; a value that rounds to zero has no minus sign; ``signed``
    writes ``+`` before a positive value (and before zero), as a difference is written.

    >>> fixed(-0.0001), fixed(-0.0001, signed=True), fixed(-0.25, 1), fixed(2.5e-4, 4, signed=True)
    ('0.000', '+0.000', '-0.2', '+0.0003')
    >>> fixed(float("nan")), fixed(-float("inf"))
    ('nan', '-inf')
    """
    text = f"{x:{'+' if signed else ''}.{digits}f}"
    if math.isfinite(x) and float(text) == 0.0 and text.startswith("-"):
        text = ("+" if signed else "") + text[1:]
    return text
