"""A port where nothing answers, for the tests of a call to a server that is not there."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def unanswered_port() -> Iterator[int]:
    """A port bound, not listening, for the whole block: a connection to it is refused, and no other
    process can bind it meanwhile (a port merely found free and let go could be taken by another
    test worker's server or store before the call, which would then meet it instead)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])
