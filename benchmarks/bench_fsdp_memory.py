"""Rank 0's peak memory of an FSDP weight sync: a full replica on rank 0 (before) vs streaming (after).

Run: ``python benchmarks/bench_fsdp_memory.py [--model qwen3-mid]``. Launches 2 gloo processes
(torchrun) once. Each loads the local ``mid`` model (built in code, ``models/architectures.py``;
fp32 as the trainer holds it) and shards it with ``fsdp.shard_model``; then, in the same
processes and one after the other, rank 0 runs the sync's memory-relevant work four ways:

* ``stream, process group``: ``fsdp_stream.GatheredModel`` (one tensor all-gathered at a time)
  grouped by ``weight_sync.buckets`` into bf16 buckets of ``--bucket-mb`` (and 256, the default
  ``rollout.sglang.sync_bucket_mb``) and flattened, each dropped before the next -- exactly what
  ``DistributedSync.push`` holds on rank 0 before its broadcast (the broadcast to a server itself
  adds no tensor: it sends the flat bucket in place; no server is launched here);
* ``stream, disk``: ``GatheredModel.save_pretrained`` (one safetensors shard gathered and written
  at a time, ``--shard-mb``);
* ``replica, process group`` / ``replica, disk`` (before this change): rank 0 loads an unsharded
  replica (``from_pretrained``, as ``fsdp.shard_with_replica`` did), gathers the full state dict
  (``fsdp.full_state_dict``), loads it into the replica, then buckets the replica's weights the
  same way / ``save_pretrained``s it.

Peak memory is the kernel's resident high-water mark (``VmHWM``), reset before each variant
(``/proc/self/clear_refs``), minus the resident size at the variant's start: honest for tensors
(torch's CPU allocator is not seen by ``tracemalloc``). Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current resident size


def _measure(fn) -> tuple[int, float]:
    import gc

    gc.collect()
    _reset_peak()
    start = _status("VmRSS")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return _status("VmHWM") - start, seconds


def worker(model_dir: str, out: Path, bucket_mb: float, shard_mb: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends.weight_sync import buckets, flatten, named_weights
    from srpo_graph.train.parallel import fsdp
    from srpo_graph.train.parallel.collectives import init_distributed, shutdown
    from srpo_graph.train.parallel.gather import GatheredModel

    torch.set_num_threads(1)
    dist = init_distributed("cpu", timeout=300.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    full_bytes = sum(p.numel() * 4 for p in model.parameters())
    fsdp.shard_model(model)
    import gc

    gc.collect()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fsdp-"))
    rows: dict[str, dict] = {}

    def stream(bucket_bytes: int):
        def run():
            g = GatheredModel(model)
            g.gather_dtype = torch.bfloat16  # as DistributedSync.push sets it (the server's dtype)
            for b in buckets(g if dist.is_main else [], bucket_bytes, torch.bfloat16):
                flat = flatten(b)  # what DistributedSync broadcasts
                del flat, b
            g.drain()
        return run

    def stream_disk():
        g = GatheredModel(model, shard_bytes=int(shard_mb * MB))
        if dist.is_main:
            g.save_pretrained(tmp / "stream")
        g.drain()

    replica_box: list = []

    def replica_sync(route: str):
        def run():
            replica = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval() \
                if dist.is_main else None  # fsdp.shard_with_replica, before this change
            full = fsdp.full_state_dict(model)  # a collective: the whole state dict on rank 0
            if replica is not None:
                replica.load_state_dict(full)
                del full
                if route == "pg":
                    for b in buckets(named_weights(replica), 256 * MB, torch.bfloat16):
                        flat = flatten(b)
                        del flat, b
                else:
                    replica.save_pretrained(tmp / "replica", safe_serialization=True)
            replica_box.append(replica)  # the replica lives on for the whole run
        return run

    variants = [("stream, process group", stream(int(bucket_mb * MB)), f"{bucket_mb:g} MiB bf16 buckets"),
                ("stream, process group (256 MiB)", stream(256 * MB), "256 MiB bf16 buckets (default)"),
                ("stream, disk", stream_disk, f"{shard_mb:g} MiB safetensors shards"),
                ("replica, process group", replica_sync("pg"), "replica + gathered state dict, 256 MiB buckets"),
                ("replica, disk", replica_sync("disk"), "replica + gathered state dict, save_pretrained")]
    for name, fn, detail in variants:
        replica_box.clear()
        peak, seconds = _measure(fn)
        rows[name] = {"peak_bytes": peak, "seconds": seconds, "detail": detail}
        replica_box.clear()
        gc.collect()
    (out / f"rank{dist.rank}.json").write_text(json.dumps({"rows": rows, "full_bytes": full_bytes,
                                                           "rss_after_shard": _status("VmRSS")}))
    shutdown(dist)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-mid")
    ap.add_argument("--bucket-mb", type=float, default=16.0)
    ap.add_argument("--shard-mb", type=float, default=16.0)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL_DIR", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]), args.bucket_mb, args.shard_mb)
        return
    from srpo_graph.models.architectures import ensure_local_model

    model_dir = ensure_local_model(args.model)
    out = Path(tempfile.mkdtemp(prefix="bench-fsdp-out-"))
    # a fixed mmap threshold: every large tensor is its own mapping, returned to the OS when freed,
    # so one variant's freed memory does not hide the next one's peak (glibc's default threshold grows)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "MALLOC_TRIM_THRESHOLD_": "131072",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            __file__,
            "--bucket-mb",
            str(args.bucket_mb),
            "--shard-mb",
            str(args.shard_mb),
            "--worker",
            str(model_dir),
            str(out),
        ],
        check=True,
        env=env,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    full = r0["full_bytes"]
    base = r0["rows"]["replica, process group"]["peak_bytes"]
    lines = [
        "## FSDP weight sync: rank 0's peak memory, replica vs streaming",
        "",
        f"`python benchmarks/bench_fsdp_memory.py` ({args.model}: {full / MB:.0f} MiB of fp32 weights, "
        f"2 gloo processes, CPU; {wall:.0f} s in all). Peak = resident high-water mark during the sync "
        "minus the resident size before it (`VmHWM` reset per variant); ratio against the replica "
        "route to a server (what rank 0 did before), same run. No server is launched: the process-group "
        "rows hold what `DistributedSync.push` holds before each broadcast.",
        "",
        "| variant | what rank 0 holds | rank 0 peak (MiB) | × model | vs replica | rank 1 peak (MiB) | seconds |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in r0["rows"].items():
        p1 = r1["rows"][name]["peak_bytes"]
        lines.append(
            f"| {name} | {row['detail']} | {row['peak_bytes'] / MB:.1f} | {row['peak_bytes'] / full:.2f} | "
            f"{row['peak_bytes'] / base:.2f} | {p1 / MB:.1f} | {row['seconds']:.2f} |"
        )
    lines += [
        "",
        "With buckets smaller than the model, rank 0 holds one bf16 bucket and its flat copy (a one-tensor bucket is "
        "sent as a view) instead of a replica plus a gathered state dict; with 16 MiB buckets: 16 + 16 MiB + the "
        "tensor being gathered (the largest tensor is always gathered whole; at most 6 MiB in bf16 for qwen3-mid). At"
        " the default 256 MiB a model this small is one bucket: its bf16 copy plus the flat copy (= the fp32 size), "
        "held during the sync only, where the replica stays for the whole run. Rank 1 gathers each tensor too, one at"
        " a time.",
    ]
    sys.path.insert(0, str(Path(__file__).parent))
    from _perfdoc import write_result, write_section

    write_section("fsdp_memory", "\n".join(lines))
    write_result(
        "fsdp_memory", {"model": args.model, "full_bytes": full, **{k: v["peak_bytes"] for k, v in r0["rows"].items()}}
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
