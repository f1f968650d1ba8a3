"""Why an SGLang server did not start, in words a user can act on (issue 39, item 2).

Backends stage, beside ``sglang_server.py``: consumes what a failed start left behind -- the
process's exit status, its log, the python and model it was given -- and produces one
:class:`~srpo_graph.errors.BackendError` that says what happened, why, and what to do, with the
log's last lines. Every way a start can fail is one of these classes, most specific first:

* **the launch command cannot run**: the SGLang python does not exist or is not executable (no
  venv yet, a wrong ``SRPO_GRAPH_SGLANG_PYTHON``);
* **killed by a signal** (a negative exit status): SIGILL is a kernel build the CPU cannot execute
  (an AVX-512/AMX build on an AVX2-only CPU), SIGKILL most often the out-of-memory killer,
  SIGSEGV/SIGBUS/SIGABRT a crash in native code; a shell's ``128 + n`` is read the same way;
* **a known line in the log**: SGLang not importable in that python, the port taken, a model
  folder the server cannot load, a CPU without the kernels' instructions reported as text, memory;
* anything else: the exit status and the log.

Only the log's tail is read (a server log can be large), and nothing here starts or stops a
process: the caller (``SGLangServer``) has already forgotten or stopped it.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from srpo_graph.errors import BackendError

INSTALL = "bash ../shared/sglang-cpu/install.sh (it picks the kernel build that matches this CPU; docs/sglang.md)"
TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class StartFailure:
    """One diagnosed start failure: what happened and what to do."""

    what: str
    fix: str


def read_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the log at ``path`` (at most its last 64 KiB are read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"


def signal_of(code: int | None) -> signal.Signals | None:
    """The signal that ended a process with exit status ``code`` (``-n`` from Popen, ``128 + n`` from a shell).

    >>> signal_of(-4).name, signal_of(132).name, signal_of(1), signal_of(None)
    ('SIGILL', 'SIGILL', None, None)
    """
    if code is None:
        return None
    n = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else None
    if n is None:
        return None
    try:
        return signal.Signals(n)
    except ValueError:
        return None


_SIGNALS = {
    signal.SIGILL: ("the server's CPU kernels use instructions this CPU lacks (an AVX-512/AMX build on a CPU "
                    "without them)", f"install the build for this CPU: {INSTALL}"),
    signal.SIGKILL: ("it was killed, most often by the kernel's out-of-memory killer (see `dmesg`)",
                     "free memory, or lower the server's KV cache (the cpu recipe's --max-total-tokens) "
                     "or the model's size"),
    signal.SIGSEGV: ("it crashed in native code (a segmentation fault in torch, sgl_kernel or a driver)",
                     f"check that the SGLang venv matches this machine: {INSTALL}"),
    signal.SIGBUS: ("it crashed in native code (a bus error: often a full /dev/shm or a truncated file)",
                    "free space in /dev/shm and the model folder's disk"),
    signal.SIGABRT: ("it aborted in native code", "read the log's last lines above"),
}

# (pattern in the log, what happened, fix); the first match wins, so the most specific come first
_LOG_CLASSES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"Illegal instruction|illegal hardware instruction", re.I),
     "the server's CPU kernels use instructions this CPU lacks", f"install the build for this CPU: {INSTALL}"),
    (re.compile(r"No module named '?(sglang|sgl_kernel|torch)\b"),
     "SGLang is not importable in the server's python", f"install it: {INSTALL}; or point "
     "SRPO_GRAPH_SGLANG_PYTHON at a python that has it"),
    (re.compile(r"Address already in use|address already in use|EADDRINUSE"),
     "its port is already taken by another process",
     "leave rollout.sglang.port unset (a free port is picked), or choose a free one"),
    (re.compile(r"(does not appear to have a file named|is not a local folder|not a valid model identifier|"
                r"Can't load the configuration|Unrecognized model|config\.json|model type .* not supported|"
                r"not supported for now|are not supported|safetensors_rust\.SafetensorError|HeaderTooLarge|"
                r"Model architectures? .* (is|are) not supported)", re.I),
     "it cannot load the model",
     "check the model folder (config.json, weights, tokenizer: `srpo-graph init-model` builds the local ones) "
     "and that SGLang supports its architecture (docs/sglang.md)"),
    (re.compile(r"(CPU|cpu).*(does not support|not supported).*(avx|amx|AVX|AMX)|requires (AVX|AMX)"),
     "the server's CPU kernels need instructions this CPU lacks", f"install the build for this CPU: {INSTALL}"),
    (re.compile(r"Not enough memory|out of memory|OutOfMemoryError|Cannot allocate memory", re.I),
     "it ran out of memory while starting",
     "free memory, or lower the KV cache (--max-total-tokens in the launch recipe) or the model's size"),
]


def diagnose(code: int | None, log_text: str) -> StartFailure:
    """The class of a start failure from the process's exit status and its log's text.

    >>> diagnose(-4, "UserWarning: ...").what.startswith("killed by SIGILL")
    True
    >>> diagnose(1, "OSError: [Errno 98] Address already in use").what
    'exited with code 1: its port is already taken by another process'
    >>> diagnose(1, "some other error").fix
    'read the log (its last lines are above)'
    """
    sig = signal_of(code)
    if sig is not None and sig in _SIGNALS:
        why, fix = _SIGNALS[sig]
        return StartFailure(f"killed by {sig.name} (exit status {code}): {why}", fix)
    for pattern, what, fix in _LOG_CLASSES:
        if pattern.search(log_text):
            return StartFailure(f"exited with code {code}: {what}", fix)
    if sig is not None:
        return StartFailure(f"killed by {sig.name} (exit status {code})", "read the log (its last lines are above)")
    return StartFailure(f"exited with code {code}", "read the log (its last lines are above)")


def exited_while_starting(url: str, code: int | None, log_path: Path) -> BackendError:
    """The error for a server that exited before it answered ``/health``, with its log's tail."""
    tail = read_tail(log_path, 60)
    failure = diagnose(code, tail)
    short = "\n".join(tail.splitlines()[-15:])
    return BackendError.at(
        f"sglang server {url}",
        f"the server {failure.what}, while starting; log {log_path}, last lines:\n{short}",
        fix=failure.fix,
    )


def cannot_launch(argv: list[str], exc: OSError, sglang_python: str) -> BackendError:
    """The error for a launch command that cannot be executed at all (no such python, not executable).

    ``sglang_python`` is the python the recipes use (``sglang_server.sglang_python()``).
    """
    program = argv[0] if argv else "?"
    if program == sglang_python and not Path(program).exists():
        what = f"the SGLang python {program} does not exist (no SGLang venv on this machine yet)"
        fix = f"install it: {INSTALL}; or set SRPO_GRAPH_SGLANG_PYTHON to a python that has SGLang"
    else:
        what = f"cannot execute {program!r}: {exc.strerror}"
        fix = ("check rollout.sglang.launch's command (its first word must be an executable), or "
               f"SRPO_GRAPH_SGLANG_PYTHON; to install SGLang: {INSTALL}")
    return BackendError.at(f"sglang launch `{' '.join(argv[:4])} ...`", what, fix=fix)
