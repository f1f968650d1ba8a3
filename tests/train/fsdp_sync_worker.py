"""Worker for test_fsdp_stream.py (not a test file): one FSDP weight sync, no full replica anywhere.

Usage: python fsdp_sync_worker.py MODEL_DIR OUT_DIR URL|- disk|distributed [SEED]
Every rank loads MODEL_DIR, perturbs it the same way (``torch.manual_seed(SEED)``, ``randn_like``
per parameter, scale 0.05: the recipe of test_weight_sync._perturbed), shards it with
``fsdp.shard_model`` and calls the sync stage's ``stream_to_backend`` (no replica: the streaming path). Rank 0
holds an SGLang backend on URL (``-``: none, the sync saves a folder with the gathered model's
``save_pretrained`` instead). Each rank writes OUT_DIR/rank<r>.json: its error (if any), the
backend's stream statistics, and the largest tensor it held during the sync.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from srpo_graph.errors import BackendError
from srpo_graph.train.parallel import fsdp
from srpo_graph.train.parallel.collectives import init_distributed, shutdown
from srpo_graph.train.parallel.gather import GatheredModel
from srpo_graph.train.sync import stream_to_backend


def main(model_dir: str, out: Path, url: str, route: str, seed: int = 1) -> None:
    torch.set_num_threads(1)
    dist = init_distributed("cpu", timeout=60.0)
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    fsdp.shard_model(m)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"rank": dist.rank}
    backend = None
    if dist.is_main and url != "-":
        from srpo_graph.backends import load_backend

        backend = load_backend("sglang", model_dir, url=url, weight_dir=out / "w", sync=route,
                               sync_options={"bucket_bytes": 4096, "timeout": 20.0}, check_health=False)
    try:
        if url == "-":  # the disk route's writer alone: every rank takes part in the gathers
            g = GatheredModel(m, shard_bytes=64 << 10)
            if dist.is_main:
                g.save_pretrained(out / "saved")
            g.drain()
            result["files"] = sorted(p.name for p in (out / "saved").iterdir()) if dist.is_main else []
            result["peak_bucket_bytes"] = g.peak_bucket_bytes
        else:
            stream_to_backend(m, backend, 31)
            if backend is not None and backend._streamer is not None:
                result["stats"] = backend._streamer.stats
    except BackendError as exc:
        result["error"] = str(exc)
    result["sharded_bytes"] = sum(p.to_local().numel() * 4 for p in m.parameters())
    result["full_bytes"] = sum(p.numel() * 4 for p in m.parameters())
    (out / f"rank{dist.rank}.json").write_text(json.dumps(result))
    if backend is not None:
        backend.close()
    shutdown(dist)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], *map(int, sys.argv[5:6]))
