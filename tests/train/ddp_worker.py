"""Worker for test_train_ddp.py / test_train_fsdp.py (not a test file): one update on a fixed SetBatch.

Run as a plain process (world size 1) or under torchrun (gloo, N processes); rank 0 writes the
final weights of both policies (safetensors) and the loss (JSON) to OUT_DIR.
Usage: python ddp_worker.py OUT_DIR [ddp|fsdp]  (fsdp: each policy wrapped with fully_shard when
the world size is > 1; rank 0 saves the gathered full state dict)
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.models.tiny import ensure_tiny_model
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies
from srpo_graph.train.parallel import collectives as distributed
from srpo_graph.train.parallel import fsdp
from srpo_graph.train.parallel.collectives import init_distributed, shutdown


def main(out: Path, strategy: str = "ddp") -> None:
    torch.set_num_threads(1)
    distributed.GRAD_BUCKET_ELEMS = 10_000  # many small buckets: the bucketing must not change the sum
    dist = init_distributed("cpu")
    path = ensure_tiny_model()
    models = []
    for i in range(2):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():  # make the two policies differ (role-specialized copies)
            g = torch.Generator().manual_seed(100 + i)
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        if dist.is_main:  # the starting weights, to check that every tensor moved
            out.mkdir(parents=True, exist_ok=True)
            save_file({k: v.clone().contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"},
                      out / f"init{i}.safetensors")
        if strategy == "fsdp" and dist.enabled:
            fsdp.shard_model(m)
        models.append(m)
    eps = synthetic_episodes(4, 4, seed=3, max_set=4, vocab=32, policies=("p0", "p1"))
    batch = compile(eps, CompileConfig(micro_batch_tokens=64, policies=("p0", "p1")))
    batch, _ = recompute_old_logprobs(models, batch)
    opts = [torch.optim.AdamW(m.parameters(), lr=5e-3) for m in models]
    res = update_policies(
        [UpdatePolicy(m, o) for m, o in zip(models, opts)],
        batch,
        LossConfig(),
        epochs=2,
        mini_batches=2,
        grad_clip=1.0,
        seed=7,
        dist=dist,
        strategy=strategy,
    )
    states = [fsdp.full_state_dict(m) for m in models]  # a collective under fsdp
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        for i, sd in enumerate(states):
            save_file({k: v.contiguous() for k, v in sd.items() if k != "lm_head.weight"}, out / f"p{i}.safetensors")
        (out / "result.json").write_text(
            json.dumps(
                {
                    "loss": res.loss,
                    "grad_norm": res.grad_norm,
                    "updates": res.num_updates,
                    "padding_forwards": res.padding_forwards,
                    "sets": batch.num_sets,
                    "micro_batches": batch.num_micro_batches,
                }
            )
        )
    shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
