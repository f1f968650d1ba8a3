"""The progress display never cuts a column to '…': fewer columns when narrow, plain lines off a TTY.

Rich renders into an in-memory Console (a real rich Console, told its width and whether it is a
terminal); the output is read back with the control codes stripped.
"""

import io
import re

import pytest
from rich.console import Console

from srpo_graph.train.observe.progress import Layout, ProgressBar

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def _record(step):
    rec = {"step": step, "reward": 0.125 + step / 1000, "loss": {"clip_frac_upper": 0.01},
           "throughput": {"gen_tokens_per_s": 10403.2}}
    if step % 10 == 0:
        rec["eval"] = {"reward": 0.5}
    return rec


def _render(console, total=100, start=0, **kw):
    with ProgressBar(total, console=console, start=start, **kw) as bar:
        for step in range(start + 1, total + 1):
            bar.advance(_record(step))
    return bar, ANSI.sub("", console.file.getvalue()).replace("\r", "\n")


@pytest.mark.parametrize("width,layout", [(140, Layout.FULL), (80, Layout.COMPACT), (56, Layout.COMPACT),
                                          (24, Layout.MINIMAL)])
def test_terminal_drops_columns_instead_of_truncating(width, layout):
    bar, text = _render(Console(file=io.StringIO(), width=width, force_terminal=True))
    assert bar.layout is layout
    assert "…" not in text
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert "100/100" in last and "0.225" in last and len(last.rstrip()) <= width
    if layout is Layout.FULL:
        assert "eval 0.500" in last and "tok/s" in last


def test_not_a_terminal_prints_plain_lines_every_n_steps():
    bar, text = _render(Console(file=io.StringIO(), width=30), total=40, start=3, plain_every=10)
    assert bar.layout is Layout.PLAIN and "…" not in text
    steps = [int(m) for m in re.findall(r"train step +(\d+)/40", text)]
    assert steps == [4, 10, 20, 30, 40]  # first step of this invocation, every 10 (= eval steps), last
    assert "reward 0.129  eval -" in text and "reward 0.165  eval 0.500" in text


def test_disabled_prints_nothing():
    console = Console(file=io.StringIO(), width=80)
    with ProgressBar(5, enabled=False, console=console) as bar:
        bar.advance(_record(1))
    assert console.file.getvalue() == ""
