"""The one reader of JSONL input: task files, trace files, ``metrics.jsonl``.

Runtime stage. Consumes a file (or one line of it) and the error class of the caller's stage;
produces JSON values, or that error naming ``file:line[:col]`` -- never a traceback. The limits,
the same for every JSONL file the project reads:

* the line must be UTF-8 (the column of the first bad byte is named);
* valid JSON (``json`` module errors keep their column);
* an integer literal of at most :data:`MAX_INT_DIGITS` digits (Python refuses 4,300 with a
  ``ValueError``, and a 4,000-digit task field would reach a prompt);
* nesting at most :data:`MAX_DEPTH` levels (deeper than Python's stack was a ``RecursionError``).

:func:`parse_line` reads one line, :func:`iter_lines` a file (``(line number, value)``, blank
lines skipped), optionally collecting bad lines instead of raising.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from srpo_graph.errors import SrpoGraphError

MAX_DEPTH = 64  # JSON nesting allowed in one line (values and tool results included)
MAX_INT_DIGITS = 100  # digits of one integer literal (2^63 has 19)


class _IntTooLong(ValueError):
    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _IntTooLong(digits)
    return int(text)


def too_deep(data: Any) -> str | None:
    """The JSON path of the first place nested deeper than :data:`MAX_DEPTH`, or None (no recursion).

    >>> too_deep({"a": [[1]]}) is None
    True
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return where or "<root>"
        if isinstance(node, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node))
    return None


def parse_line(line: str | bytes, path: str, lineno: int, error: type[SrpoGraphError]) -> Any:
    """One JSONL line as a JSON value; ``error`` (the caller's stage's class) names ``path:line[:col]``.

    >>> from srpo_graph.errors import RuntimeFailure
    >>> parse_line(b'{"a": \\xff}', "t.jsonl", 3, RuntimeFailure)
    Traceback (most recent call last):
    ...
    srpo_graph.errors.RuntimeFailure: t.jsonl:3:7: error: not UTF-8 text (byte 0xff)
    >>> parse_line('{"n": ' + "9" * 5000 + "}", "t.jsonl", 2, RuntimeFailure)
    Traceback (most recent call last):
    ...
    srpo_graph.errors.RuntimeFailure: t.jsonl:2: error: not valid JSON here: an integer with 5000 digits (at most 100)
    """
    if isinstance(line, bytes):
        raw = line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            col = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
            raise error.at(f"{path}:{lineno}:{col}", f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    try:
        data = json.loads(line, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise error.at(f"{path}:{lineno}:{exc.colno}", f"not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise error.at(f"{path}:{lineno}", f"not valid JSON here: nested deeper than {MAX_DEPTH} levels") from None
    except _IntTooLong as exc:
        raise error.at(f"{path}:{lineno}", f"not valid JSON here: an integer with {exc.digits} digits "
                       f"(at most {MAX_INT_DIGITS})") from None
    except ValueError as exc:  # anything else the json module refuses to convert
        raise error.at(f"{path}:{lineno}", f"not valid JSON here: {exc}") from None
    deep = too_deep(data)
    if deep is not None:
        raise error.at(f"{path}:{lineno}", f"field {deep}: nested deeper than {MAX_DEPTH} levels")
    return data


def iter_lines(path: str | os.PathLike, error: type[SrpoGraphError], *, what: str = "file",
               bad: list[Any] | None = None,
               parse: Callable[[bytes, str, int], Any] | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSONL file (``parse(line, path,
    lineno)`` instead of :func:`parse_line` turns a line into a value, e.g. a trace's episode).

    Args:
        error: the caller's error class.
        what: the kind of file, for "cannot read <what>".
        bad: when given, bad lines are appended to it and skipped instead of raising.
    Raises:
        error: the file cannot be opened; a bad line (unless ``bad`` is given).
    """
    p = Path(path)
    try:
        fh = p.open("rb")  # bytes: a line that is not UTF-8 is an error of that line, not of the reader
    except OSError as exc:
        raise error.at(str(p), f"cannot read {what}: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, (parse(line, str(p), lineno) if parse is not None
                               else parse_line(line, str(p), lineno, error))
            except SrpoGraphError as exc:
                if bad is None:
                    raise
                bad.append(exc)


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "iter_lines", "parse_line", "too_deep"]
