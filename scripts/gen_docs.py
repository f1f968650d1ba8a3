"""Regenerate the generated blocks of docs/ from the code's tables (run after changing a table).

Each block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` in a
markdown file; the tests check every block is current (tests/test_docs_generated.py).

    python scripts/gen_docs.py          # rewrite the blocks
    python scripts/gen_docs.py --check  # exit 1 when a block is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def _config() -> str:
    from srpo_graph.train.config.loading import config_reference

    return config_reference()


def _objectives() -> str:
    from srpo_graph.srpo.objectives import objectives_table

    return objectives_table()


def _backends() -> str:
    from srpo_graph.backends import BACKENDS

    rows = ["| backend | options (`rollout.<backend>.*`) | samples from | errors | loss defaults | what |",
            "|---|---|---|---|---|---|"]
    for name, spec in BACKENDS.items():
        fields = ", ".join(f"`{f}`" for f in spec.options.model_fields) or "none"
        where = "the trained model, in process" if spec.in_process else "its own copy (weights synced each update)"
        errors = "fail the episode (budget `rollout.max_failed_fraction`)" if spec.remote else "stop the step"
        defaults = ", ".join(f"`{k} = {v}`" for k, v in spec.loss_defaults.items()) or "none"
        rows.append(f"| `{name}` | {fields} | {where} | {errors} | {defaults} | {spec.summary} |")
    return "\n".join(rows)


def _exit_codes() -> str:
    from srpo_graph.errors import exit_codes_table

    return exit_codes_table()


def _combinations() -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("combinations", ROOT / "tests" / "combinations.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault("combinations", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # (registered first: its dataclasses look their module up)
    return module.doc_table()


BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "exit-codes": ("docs/architecture.md", _exit_codes),
    "backends": ("docs/architecture.md", _backends),
    "config-reference": ("docs/training.md", _config),
    "objectives": ("docs/algorithm.md", _objectives),
    "combinations": ("docs/combinations.md", _combinations),
}


def render(text: str, name: str, body: str) -> str:
    """``text`` with block ``name`` replaced by ``body`` (ValueError if the markers are missing)."""
    pattern = re.compile(
        rf"(<!-- generated: {re.escape(name)} -->\n)(?:.*?\n)?(<!-- end generated: {re.escape(name)} -->)", re.S
    )
    if not pattern.search(text):
        raise ValueError(f"no block {name!r} (markers <!-- generated: {name} --> ... <!-- end generated: {name} -->)")
    return pattern.sub(lambda m: m.group(1) + body.strip() + "\n" + m.group(2), text)


def stale() -> list[str]:
    """Names of the blocks whose file differs from what the code generates."""
    out = []
    for name, (rel, make) in BLOCKS.items():
        text = (ROOT / rel).read_text(encoding="utf-8")
        if render(text, name, make()) != text:
            out.append(f"{rel}: {name}")
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for b in bad:
            print(f"stale generated block {b}: run python scripts/gen_docs.py", file=sys.stderr)
        return 1 if bad else 0
    for name, (rel, make) in BLOCKS.items():
        path = ROOT / rel
        path.write_text(render(path.read_text(encoding="utf-8"), name, make()), encoding="utf-8")
        print(f"wrote {rel}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
