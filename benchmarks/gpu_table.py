"""docs/gpu.md's memory table, from the costs bench_real_models.py measured (P8).

Run: ``python benchmarks/gpu_table.py`` after ``python benchmarks/bench_real_models.py``; reads
benchmarks/results/real_models.json and rewrites the block between ``<!-- bench:gpu_memory -->``
markers in docs/gpu.md. The costs are measured on CPU at Qwen2.5-0.5B's shape; the table scales
them to each model: per-parameter bytes as measured (bf16 weights: weights, gradients, AdamW's two
states), activation bytes per token per layer in proportion to the layer's width (hidden +
MLP size, relative to 896 + 4,864), the lm_head's per-token bytes in proportion to the
vocabulary. These are CPU allocator numbers (RSS); a GPU's caching allocator adds fragmentation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "real_models.json"
DOC = ROOT / "docs" / "gpu.md"
MID_WIDTH = 896 + 4864
MICRO_TOKENS = 8192  # compile.micro_batch_tokens' default
GIB = 2**30

# name: (parameters, hidden, MLP, layers, vocabulary, update layout, shards)
MODELS = {
    "Qwen2.5-3B": (3.09e9, 2048, 11008, 36, 151_936, "DDP", 1),
    "Qwen2.5-7B": (7.62e9, 3584, 18944, 28, 152_064, "FSDP over 4", 4),
    "Qwen3-4B": (4.02e9, 2560, 9728, 36, 151_936, "FSDP over 4", 4),
    "Qwen3-8B": (8.19e9, 4096, 12288, 36, 151_936, "FSDP over 4", 4),
}


def _costs() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))["costs"]


def table(c: dict) -> str:
    per_param = c["bfloat16 weights: bytes per parameter (weights, gradients, Adam states)"]
    act_bf16 = c["activations, bytes per token per layer (mid shape + bf16)"]
    act_ckpt = c["activations, bytes per token per layer (mid shape + ckpt)"]
    head = c["whole minus chunked at V=151,936, bytes per completion token"]
    lines = [
        f"Memory **from measured costs** (`benchmarks/bench_real_models.py`, docs/performance.md P8; this block is "
        f"written by `benchmarks/gpu_table.py`): per parameter, bf16 weights {per_param[0]:.1f} B + gradients "
        f"{per_param[1]:.1f} B + AdamW states {per_param[2]:.1f} B; activations of a micro-batch of {MICRO_TOKENS:,} "
        f'tokens under `optim.autocast = "bfloat16"`, {act_bf16 / 1024:.1f} KiB per token per layer at Qwen2.5-0.5B\'s '
        f"width ({act_ckpt / 1024:.1f} KiB with `optim.gradient_checkpointing`), scaled by each layer's width "
        f"(hidden + MLP); the whole [tokens, V] lm_head blocks the update held before the chunked head, "
        f"{head / 2**20:.2f} MiB per completion token at V = 151,936 (now a few [chunk, V] blocks: ~0.2 GiB). "
        "The SGLang KV cache comes on top.",
        "",
        "| model | weights | weights + grads + Adam (one copy) | update layout | per-GPU weights + grads + Adam | "
        "activations, 8k-token micro-batch (bf16 / + checkpointing) | lm_head blocks before / now |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (n, h, i, layers, vocab, layout, shards) in MODELS.items():
        weights = n * per_param[0]
        full = n * sum(per_param)
        per_gpu = full / shards  # FSDP with SGLang rollouts: the sync streams buckets, no whole copy on rank 0
        scale = (h + i) / MID_WIDTH * layers * MICRO_TOKENS
        whole = head * vocab / 151_936 * MICRO_TOKENS
        lines.append(
            f"| {name} | {weights / GIB:.0f} GiB | {full / GIB:.0f} GiB | {layout} | {per_gpu / GIB:.0f} GiB"
            f"{' (+ one sync bucket)' if shards > 1 else ''} | {act_bf16 * scale / GIB:.0f} GiB / "
            f"{act_ckpt * scale / GIB:.1f} GiB | {whole / GIB:.1f} GiB / ~0.2 GiB |"
        )
    return "\n".join(lines)


def main() -> None:
    body = table(_costs())
    text = DOC.read_text(encoding="utf-8")
    block = f"<!-- bench:gpu_memory -->\n{body}\n<!-- /bench:gpu_memory -->"
    pattern = re.compile(r"<!-- bench:gpu_memory -->.*?<!-- /bench:gpu_memory -->", re.S)
    if not pattern.search(text):
        raise SystemExit("docs/gpu.md has no <!-- bench:gpu_memory --> block")
    DOC.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")
    print(body)


if __name__ == "__main__":
    main()
