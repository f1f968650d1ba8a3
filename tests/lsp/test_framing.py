"""The framing of the server's transport (Note [Framing faults] in srpo_graph/lsp/framing.py), in
process: valid messages cut into chunks anywhere come out whole, and after any fault the next valid
message comes out (the server's own tests, over stdio, send each fault to a real process)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from srpo_graph.lsp.framing import Framer
from tests.support.lsp_wire import frame

BODIES = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "m", "params": {"text": "é" * i + '"\\\r\n'}}).encode()
          for i in range(6)]
FAULTS = [b"Content-Length: 100000\r\n\r\n" + BODIES[0], b"Content-Length: 10\r\n\r\n" + BODIES[0],
          bytes(range(256)), frame(BODIES[0])[:30], b"Content-Length: x\r\n\r\n{}", BODIES[0] + b"\r\n",
          b"Content-Length: 5\r\nNot a header\r\n\r\n[1,2]", b"Content-Len", b"\r\n\r\n"]


def _feed(stream: bytes, cuts: list[int]) -> tuple[list[bytes], list[str]]:
    framer, bodies, faults = Framer(), [], []
    at = 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        got, said = framer.feed(stream[at:cut])
        bodies += got
        faults += said
        at = cut
    return bodies, faults


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_valid_messages_cut_anywhere_come_out_whole(cuts):
    assert _feed(b"".join(frame(b) for b in BODIES), cuts) == (BODIES, [])


@settings(max_examples=300, deadline=None)
@given(faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=3), cuts=st.lists(st.integers(0, 10**6),
                                                                                      max_size=20))
def test_after_any_fault_the_next_valid_message_comes_out(faults, cuts):
    stream = b"".join(f + frame(b) for f, b in zip(faults, BODIES[1:]))
    bodies, said = _feed(stream, cuts)
    assert [b for b in bodies if b in BODIES[1:]] == BODIES[1:len(faults) + 1]  # each valid one, in order
    assert said or all(not f.strip() for f in faults)  # and each fault is said (blank lines are none)
