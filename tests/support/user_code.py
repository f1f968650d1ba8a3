"""Workflows with misbehaving user code (issue 23, items 3 and 6; issue 24, item 1), built next
to a user module in a temporary folder, the way a user writes them."""

from __future__ import annotations

import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository

MODULE = '''
import time

def sleepy_reward(target: int, a: int, b: int) -> float:
    time.sleep(60)
    return 1.0

def exit_reward(target: int, a: int, b: int) -> float:
    raise SystemExit(0)

def interrupt_reward(target: int, a: int, b: int) -> float:
    raise KeyboardInterrupt

def str_reward(target: int, a: int, b: int) -> float:
    return "1.0"

def bool_reward(target: int, a: int, b: int) -> float:
    return True

def raising_reward(target: int, a: int, b: int) -> float:
    raise ValueError("reward broke")

def half_reward(target: int, a: int, b: int) -> float:
    if target % 2:
        raise ValueError("odd target")
    return float((a + b) % 10 == target)

def hang(a: int) -> str:
    open(__file__ + ".started", "w").close()  # tests wait for this before signalling
    time.sleep(3600)
    return "never"

def quick(a: int) -> str:
    return "ok"

def exit_tool(a: int) -> str:
    raise SystemExit(3)

def _end(how: str) -> float:
    """The ways user code ends its process without raising (srpo_graph/supervisor.py); while the
    path $USER_CODE_END_ONCE does not exist it returns 0.0 instead (e.g. a run's first checkpoint)."""
    import ctypes
    import os
    import signal

    once = os.environ.get("USER_CODE_END_ONCE")
    if once and not os.path.exists(once):
        return 0.0
    if how == "exit0":
        os._exit(0)
    if how == "exit3":
        os._exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # (a signal is delivered at once; never reached)
    if how == "segfault":
        ctypes.string_at(0)
    raise AssertionError(how)

def exit0_reward(target: int, a: int, b: int) -> float:
    return _end("exit0")

def exit3_reward(target: int, a: int, b: int) -> float:
    return _end("exit3")

def sigkill_reward(target: int, a: int, b: int) -> float:
    return _end("sigkill")

def sigterm_reward(target: int, a: int, b: int) -> float:
    return _end("sigterm")

def segfault_reward(target: int, a: int, b: int) -> float:
    return _end("segfault")

def exit0_tool(a: int) -> str:
    return str(_end("exit0"))

def stuck_in_a_library_reward(target: int, a: int, b: int) -> float:
    """Past its deadline inside an extension's frames: pydantic-core (Rust) calling a Python
    validator that keeps computing (bounded, so a failed test leaves no process behind)."""
    from pydantic import BaseModel, field_validator

    class Checked(BaseModel):
        value: int

        @field_validator("value")
        @classmethod
        def slow(cls, v: int) -> int:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                v = (v * 31 + 7) % 1_000_003
            return v

    return float(Checked(value=target).value > -1)

def sleepy_digit(text: str) -> int:
    time.sleep(60)
    return 1

if __import__("os").environ.get("USER_CODE_END_AT_IMPORT"):  # ends the process while imported
    _end(__import__("os").environ["USER_CODE_END_AT_IMPORT"])
'''


def make(tmp_path: Path, *, reward: str | None = None, tool: str | None = None, extractor: str | None = None,
         name: str = "case") -> tuple[Path, str, int]:
    """A coord_seq workflow using ``mine.<reward>`` / a tool ``mine.<tool>(a)`` / agent a's
    extractor ``mine.<extractor>``; returns (path, module name, the changed line's number)."""
    mod = f"user_code_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(MODULE, encoding="utf-8")
    text = (ROOT / "workflows" / "coord_seq.wf").read_text(encoding="utf-8")
    text = text.replace("import std\n", f"import std\nimport {mod} as mine\n")
    marker = ""
    if reward:
        marker = f"reward: mine.{reward}(task.target, a, b)"
        text = text.replace("reward: std.digits_sum_to(task.target, a, b)", marker)
    if tool:
        marker = f"  tool note = mine.{tool}(a)"
        text = text.replace("  consume: a\n  activate: b\n", f"  consume: a\n{marker}\n  activate: b\n")
    if extractor:
        marker = f"  output: int via mine.{extractor}"
        text = text.replace("  output: int via std.digit\n", marker + "\n", 1)
    path = tmp_path / f"{name}.wf"
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index(marker) + 1
    return path, mod, line
