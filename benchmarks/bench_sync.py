"""Weight sync per step to a real SGLang CPU server: disk (save_pretrained + /update_weights_from_disk)
vs a process group (gloo broadcast of flattened buckets + /update_weights_from_distributed), at
three model sizes. Writes its section of docs/performance.md and benchmarks/results/sync.json.

Usage: ``python benchmarks/bench_sync.py [--repeats 3] [--sizes tiny,mid,large]``
(needs the SGLang venv of shared/sglang-cpu; one server per size, ~1 min each to start).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support.sglang_servers
from _perfdoc import machine, write_result, write_section  # noqa: E402

# name -> Llama shape (hidden, layers, intermediate, vocab); built in code, random weights
SIZES = {
    "tiny": None,  # the tiny default model itself
    "mid": (512, 4, 1408, 32000),
    "large": (896, 8, 2432, 32000),
}


def build(name: str, root: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer

    tiny = ensure_tiny_model()
    if SIZES[name] is None:
        return Path(tiny)
    hidden, layers, inter, vocab = SIZES[name]
    tok = load_tokenizer(str(tiny))
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    path = root / name
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="tiny,mid,large")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends import load_backend
    from tests.support.sglang_servers import start_real_server

    rows, data = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        root = Path(tmp)
        for name in args.sizes.split(","):
            path = build(name, root)
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            params = sum(p.numel() for p in model.parameters())
            server = start_real_server(path, root)
            try:
                times: dict[str, list[float]] = {"disk": [], "distributed": []}
                for mode in ("disk", "distributed"):
                    b = load_backend("sglang", str(path), url=server.url, weight_dir=root / f"w-{name}", sync=mode)
                    b.sync_weights(model, 1)  # warm-up (the group is made here for `distributed`)
                    for r in range(args.repeats):
                        t0 = time.perf_counter()
                        b.sync_weights(model, 2 + r)
                        times[mode].append(time.perf_counter() - t0)
                    b.close()
            finally:
                server.stop()
            disk, dist = statistics.median(times["disk"]), statistics.median(times["distributed"])
            data[name] = {"params": params, "disk_s": disk, "distributed_s": dist}
            rows.append(f"| {name} | {params / 1e6:.1f}M | {disk:.2f} | {dist:.2f} | {disk / dist:.1f}x |")
            print(rows[-1], flush=True)
    write_result("sync", data)
    write_section("sync", "\n".join([
        "## Weight sync per step: disk vs process group (benchmarks/bench_sync.py)",
        "",
        f"One real SGLang CPU server (bf16) per size, fp32 trainer weights; median of {args.repeats} syncs after a "
        "warm-up. `disk`: `save_pretrained` into the weight folder + `/update_weights_from_disk`; `distributed`: "
        "one gloo broadcast per 256 MiB flattened bucket (bf16) + `/update_weights_from_distributed` "
        "(`rollout.sglang.sync`). Both include the prefix-cache flush. Llama shapes, tied embeddings, random weights. "
        f"Machine: {machine()}.",
        "",
        "| model | parameters | disk (s) | process group (s) | speed-up |",
        "|---|---|---|---|---|",
        *rows,
    ]))


if __name__ == "__main__":
    main()
