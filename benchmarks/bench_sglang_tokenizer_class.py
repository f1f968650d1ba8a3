"""A real SGLang CPU server's start on an exact released vocabulary: ``tokenizer_class`` as transformers
writes it vs the released one.

transformers 5 saves a tokenizer built from a ``tokenizers`` object as ``"tokenizer_class":
"TokenizersBackend"``; the released Qwen files say ``"Qwen2Tokenizer"`` (Note [The released
tokenizer_class], srpo_graph/models/vocab.py). Two copies of one model folder (``--model``, default
``qwen3-realvocab-test``: 151,669 tokens), the same but for that one field, each started through
``SGLangServer`` with the cpu recipe, alternating, ``--repeats`` times: launch to healthy, and the
CPU of the server's process group (``bench_sglang_start.start_once``).

Writes its section of docs/performance.md (``sglang-tokenizer-class``) and
benchmarks/results/sglang_tokenizer_class.json.

Usage: ``python benchmarks/bench_sglang_tokenizer_class.py [--repeats 3] [--model NAME]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402
from bench_sglang_start import start_once  # noqa: E402

from srpo_graph.models.released import ensure_shaped_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="qwen3-realvocab-test")
    args = parser.parse_args()
    source = ensure_shaped_model(args.model)
    released = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))["tokenizer_class"]
    classes = {"as transformers writes it": "TokenizersBackend", "the released one": released}
    runs: dict[str, list[tuple[float, float, int]]] = {way: [] for way in classes}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for way, cls in classes.items():
            folder = folders[way] = Path(tmp) / cls
            shutil.copytree(source, folder)
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": cls}),
                                                           encoding="utf-8")
        for i in range(args.repeats):
            for way in classes:
                runs[way].append(start_once("cpu", str(folders[way]), Path(tmp)))
                print(f"{i + 1}/{args.repeats} {way}: {runs[way][-1][0]:.1f} s, {runs[way][-1][1]:.1f} CPU-s",
                      flush=True)
    med = {way: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for way, rs in runs.items()}
    base_wall, base_cpu = med["as transformers writes it"]
    lines = [
        "## A real SGLang server's start on an exact vocabulary: the `tokenizer_class` it reads "
        "(`benchmarks/bench_sglang_tokenizer_class.py`)",
        "",
        f"{machine()}; model `{args.model}`, the cpu recipe; median of {args.repeats} starts each, alternating, "
        "of two copies of its folder that differ in `tokenizer_config.json`'s `tokenizer_class` alone. **To "
        "healthy**: launch to the first `/health` answer; **server CPU**: its process group's, once healthy. "
        "SGLang resolves transformers' generic `TokenizersBackend` by loading the tokenizer twice more, in each of "
        "its three processes; the released name is loaded once (Note [The released tokenizer_class]).",
        "",
        "| `tokenizer_class` | to healthy | server CPU | vs as transformers writes it (time, CPU) |",
        "|---|---:|---:|---:|",
    ]
    for way, (wall, cpu) in med.items():
        lines.append(f"| {way} (`{classes[way]}`) | {wall:.1f} s | {cpu:.1f} CPU-s | "
                     f"{base_wall / wall:.2f}x, {base_cpu / cpu:.2f}x |")
    write_section("sglang-tokenizer-class", "\n".join(lines), after="sglang-start")
    write_result("sglang_tokenizer_class", {way: {"healthy_s": m[0], "cpu_s": m[1]} for way, m in med.items()})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
