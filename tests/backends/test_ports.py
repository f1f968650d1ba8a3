"""Ports handed to children that bind them later are claimed machine-wide (srpo_graph.backends.ports).

The flake this guards against (CI at 3230520): two pytest-xdist workers each picked "a free port"
for a server that binds it ~20 s later, picked the same one, and one worker's server answered the
other's launch. Real processes and real sockets throughout.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srpo_graph.backends.ports import _claim_range, claim, claim_ports, port_in_use, release
from srpo_graph.backends.sglang_server import launch_ports
from srpo_graph.errors import ConfigError

HOLDER = textwrap.dedent("""
    import sys
    from srpo_graph.backends.ports import claim, claim_ports
    ports = claim_ports(int(sys.argv[1]))
    extra = [int(p) for p in sys.argv[2:]]
    print(" ".join(map(str, ports)), " ".join("1" if claim(p) else "0" for p in extra), sep="|", flush=True)
    sys.stdin.read()  # hold the claims until the parent closes our stdin
""")


def _holder(count: int, *extra: int) -> tuple[subprocess.Popen, list[int], list[bool]]:
    """A second process that claims ``count`` ports (and tries ``extra``) and holds them."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(count), *map(str, extra)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    got, tried = proc.stdout.readline().strip().split("|")
    return proc, [int(p) for p in got.split()], [t == "1" for t in tried.split()]


def _end(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_claimed_ports_are_free_distinct_and_below_the_ephemeral_range():
    lo, hi = _claim_range()
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = claim_ports(50)
    try:
        assert len(set(ports)) == 50
        assert all(lo <= p <= hi < ephemeral_low for p in ports)
        assert not any(22000 <= p <= 29999 for p in ports)  # SGLang's own pick range
        assert not any(port_in_use(p) for p in ports)
        again = claim_ports(50)  # this process never hands out a port twice while it is unreleased
        assert not set(again) & set(ports)
        release(again)
    finally:
        release(ports)


@pytest.mark.proc  # a second process holding claims
def test_another_process_is_never_handed_a_claimed_port_and_its_claims_die_with_it():
    mine = claim_ports(200)
    try:
        proc, theirs, tried = _holder(200, *mine[:5])
        try:
            assert not set(theirs) & set(mine)
            assert tried == [False] * 5  # our claims hold against another process
            assert not any(claim(p) for p in theirs[:5])  # and theirs against us
        finally:
            _end(proc)
        assert all(claim(p) for p in theirs[:5])  # its claims went with its exit
        release(theirs[:5])
    finally:
        release(mine)


@pytest.mark.proc  # a second process holding claims
def test_a_given_port_claimed_by_another_process_is_refused_naming_it():
    proc, (port,), _ = _holder(1)
    try:
        assert not port_in_use(port)  # nothing listens there yet: only the claim says it is taken
        with pytest.raises(ConfigError, match=rf"field `rollout.sglang.port` \({port}\).*claimed by another "
                                              r"srpo-graph process") as info:
            launch_ports(port, 1)
        assert "fix:" in str(info.value)
    finally:
        _end(proc)
    assert launch_ports(port, 1) == [port]  # free once that process ended
    release([port])


@pytest.mark.proc  # a second process holding claims
def test_a_released_port_can_be_claimed_elsewhere():
    (port,) = claim_ports(1)
    proc, _, tried = _holder(0, port)
    _end(proc)
    assert tried == [False]
    release([port])
    proc, _, tried = _holder(0, port)
    _end(proc)
    assert tried == [True]


def test_a_port_claimed_by_name_is_not_handed_out_again_and_threads_never_share_one():
    from concurrent.futures import ThreadPoolExecutor

    from srpo_graph.backends import ports

    lo, hi = _claim_range()
    named = lo + 7
    assert claim(named)
    try:
        # the whole range, so `named` would be reached if it were not already this process's
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ports, "CLAIM_RANGE", (lo, lo + 99))
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda _: claim_ports(20), range(4)))
        flat = [p for g in got for p in g]
        assert named not in flat
        assert len(flat) == len(set(flat)) == 80  # four threads at once, no port twice
        release(flat)
    finally:
        release([named])


def test_a_launch_that_fails_before_its_servers_start_gives_their_ports_back(tmp_path):
    """A launch command the fleet refuses (no {model}): the ports claimed for its two servers go back."""
    from types import SimpleNamespace

    from srpo_graph.backends import ports
    from srpo_graph.backends.options import SGLangOptions
    from srpo_graph.backends.sglang_fleet import serve_policies
    from srpo_graph.errors import BackendError

    before = set(ports._HELD)
    policies = [SimpleNamespace(name=n, model_path=str(tmp_path / n), model=None) for n in ("a", "b")]
    with pytest.raises(BackendError, match="must contain {model} and {port}"):
        serve_policies(policies, SGLangOptions(launch="serve {port}"), tmp_path)
    assert set(ports._HELD) == before
