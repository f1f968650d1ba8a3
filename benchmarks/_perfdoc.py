"""Write one benchmark's section into docs/performance.md (replacing its previous run).

Each section sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` so benchmarks of
different engineers can share the file and rerun without duplicating their sections.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
RESULTS = Path(__file__).resolve().parent / "results"  # each benchmark's headline numbers (JSON), for the P1-P7 summary


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def write_result(name: str, data: dict[str, Any]) -> None:
    """Save a benchmark's headline numbers as ``benchmarks/results/NAME.json`` (``run_all.py`` reads them)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), **data}, indent=1) + "\n", encoding="utf-8")


def read_result(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_section(name: str, body: str, *, first: bool = False, after: str | None = None) -> None:
    """Replace section NAME of docs/performance.md (new sections go last, or right after the
    title and intro with ``first``, or right after section ``after`` where it exists)."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = (
        DOC.read_text(encoding="utf-8")
        if DOC.exists()
        else "# Performance\n\nMeasured by the scripts in `benchmarks/`; ratios are within one run.\n"
    )
    block = f"<!-- bench:{name} -->\n{body.rstrip()}\n<!-- /bench:{name} -->"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    old = pattern.search(text)
    if old:
        block = _keep_rows(old.group(0), block)
        text = pattern.sub(lambda _: block, text)
    elif after is not None and f"<!-- /bench:{after} -->" in text:
        at = text.index(f"<!-- /bench:{after} -->") + len(f"<!-- /bench:{after} -->")
        text = text[:at] + "\n\n" + block + text[at:]
    elif first and "\n<!-- bench:" in text:
        at = text.index("\n<!-- bench:") + 1
        text = text[:at] + block + "\n\n" + text[at:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text, encoding="utf-8")


def _keep_rows(old: str, new: str, keep: str = r"sglang") -> str:
    """``new`` with the table rows of ``old`` that match ``keep`` (and are not in ``new``) put back
    after ``new``'s last table row: rows other engineers add by hand (the SGLang backend's row)
    survive a rerun of the benchmark that owns the section."""
    rows = [
        line for line in old.splitlines() if line.startswith("|") and re.search(keep, line, re.I) and line not in new
    ]
    if not rows:
        return new
    lines = new.splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith("|")), default=len(lines) - 2)
    return "\n".join(lines[: last + 1] + rows + lines[last + 1 :])
