"""Write one benchmark's section into docs/performance.md (replacing its previous run).

Each section sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` so benchmarks of
different engineers can share the file and rerun without duplicating their sections.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def write_section(name: str, body: str) -> None:
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else "# Performance\n\nMeasured by the scripts in `benchmarks/`; ratios are within one run.\n"
    block = f"<!-- bench:{name} -->\n{body.rstrip()}\n<!-- /bench:{name} -->"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text, encoding="utf-8")
