"""The editor's check with imports: in a child process, under a time limit.

Stage: lsp. A ``.wf`` file's ``import`` lines run Python code when checked. In the editor that
is off by default (``check --no-import`` semantics); when a user turns it on, the check runs in a
fresh child process (``python -m srpo_graph.lsp.imports``: it gets the text on stdin and writes
the diagnostics as JSON on stdout) so that a module that hangs, loops or exits never blocks the
server, and a module edited since the last check is imported anew. Past the time limit the
child's whole process group is killed and the caller keeps its no-import diagnostics.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from srpo_graph.errors import Diagnostic, Span
from srpo_graph.lang.checker import ImportPolicy


@dataclass(frozen=True)
class ImportOutcome:
    """The child's answer: ``diagnostics`` (None when it gave none) and why not (``problem``)."""

    diagnostics: list[Diagnostic] | None
    problem: str = ""
    tool_types: dict[str, str] = field(default_factory=dict)  # name -> `.wf` type, from the imported functions


def to_json(d: Diagnostic) -> dict:
    return {"message": d.message, "span": d.span.model_dump() if d.span else None, "hint": d.hint,
            "severity": d.severity, "code": d.code, "where": d.where, "why": d.why,
            "related": [[s.model_dump(), what] for s, what in d.related]}


def from_json(x: dict) -> Diagnostic:
    """The inverse of :func:`to_json`.

    >>> d = Diagnostic("m", Span(path="a", line=1, col=2, end_line=1, end_col=3), "fix", code="c")
    >>> from_json(to_json(d)) == d
    True
    """
    return Diagnostic(x["message"], Span(**x["span"]) if x["span"] else None, x["hint"], x["severity"], x["code"],
                      x["where"], x["why"], tuple((Span(**s), what) for s, what in x["related"]))


READY = b"ready\n"  # the child's first line: its own imports are done, the user's begin
START_DEADLINE = 120.0  # seconds the child may take to start (python and srpo_graph), however loaded


async def check_in_child(text: str, path: str, policy: ImportPolicy, timeout: float) -> ImportOutcome:
    """Check ``text`` with imports (``policy``) in a child process.

    Note [The import deadline]: ``timeout`` bounds the user's part only -- importing the file's
    modules and the check -- counted from the child's ``ready`` line, after its own start (python,
    srpo_graph), which on a loaded machine can alone take longer than the whole limit (issue 39,
    item 5: a module importing only ``typing`` timed out after 5 s). The start has a deadline of its
    own (:data:`START_DEADLINE`), so nothing waits forever.

    Returns:
        The diagnostics, or None with the reason (timed out, the child died).
    """
    request = json.dumps({"text": text, "path": path,
                          "allowed": list(policy.allowed) if policy.allowed is not None else None})
    # the child imports this very srpo_graph, wherever it was found (an install or a checkout)
    here = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (here, os.environ.get("PYTHONPATH")) if x)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "srpo_graph.lsp.imports", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, start_new_session=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    stage = "start"
    try:
        proc.stdin.write(request.encode("utf-8"))
        await proc.stdin.drain()
        proc.stdin.close()
        first = await asyncio.wait_for(proc.stdout.readline(), START_DEADLINE)
        if first == READY:
            stage = "check"
            out = await asyncio.wait_for(proc.stdout.read(), timeout)
            await asyncio.wait_for(proc.wait(), timeout)
        else:
            out = first + await proc.stdout.read()
            await proc.wait()
    except (asyncio.TimeoutError, asyncio.CancelledError, ConnectionError) as exc:
        _kill(proc)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        if stage == "start":
            return ImportOutcome(None, f"the check with imports did not start within {START_DEADLINE:g} s "
                                       "(python and srpo_graph); showing the check without imports")
        return ImportOutcome(None, f"importing the file's modules and checking took longer than {timeout:g} s (a "
                                   "module's import hangs or is slow); showing the check without imports")
    if proc.returncode != 0:
        return ImportOutcome(None, f"the check with imports ended with exit status {proc.returncode}; "
                                   "showing the check without imports")
    try:
        answer = json.loads(out.decode("utf-8"))
        return ImportOutcome([from_json(x) for x in answer["diagnostics"]], tool_types=dict(answer["tool_types"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ImportOutcome(None, "the check with imports answered something unreadable (a module printed "
                                   "to stdout?); showing the check without imports")


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
    except (ProcessLookupError, PermissionError):
        pass


def _main() -> None:  # pragma: no cover - run as the child process, exercised through the server's tests
    from srpo_graph.lsp.document import analyze

    request = json.loads(sys.stdin.read())
    sys.stdout.buffer.write(READY)  # Note [The import deadline]: the user's part starts now
    sys.stdout.buffer.flush()
    allowed = request["allowed"]
    policy = ImportPolicy(allowed=tuple(allowed) if allowed is not None else None)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # a module that prints while imported must not corrupt the answer
    try:
        analysis = analyze(request["text"], request["path"], policy)
    finally:
        sys.stdout = real_stdout
    from srpo_graph.workflow import type_str

    wf = analysis.workflow
    untyped = analysis.result.untyped_tools if analysis.result is not None else frozenset()
    tools = {} if wf is None else {tc.name: type_str(tc.type) for t in wf.transitions for tc in t.tools
                                   if tc.name not in untyped}
    real_stdout.write(json.dumps({"diagnostics": [to_json(d) for d in analysis.diagnostics], "tool_types": tools}))
    real_stdout.flush()
    os._exit(0)  # a module's threads or atexit hooks must not keep the child alive


if __name__ == "__main__":  # pragma: no cover
    _main()
