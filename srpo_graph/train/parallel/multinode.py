"""Trainer stage: a job over several nodes (torchrun, static rendezvous) with no shared file system.

Consumes :class:`~srpo_graph.train.parallel.job.DistInfo`, the resolved config and the workflow
source of each rank; produces one config every rank agrees on, and the checkpoint a resumed run
starts from on every node. (The torchrun command line of one node is ``launch.py``'s.)

What a multi-node job assumes (docs/gpu.md): the code, the ``.wf`` file and its task files are
on every node (like the program itself); the **run folder lives on the node of rank 0 only**.
So:

* rank 0's config wins, and a node whose own command line resolved another config (another
  workflow, other overrides; the default run folder's time stamp aside) stops the job on every
  rank at once with the ranks named (:func:`agree_config`), never a hang;
* rank 0 alone writes the run folder (metrics, checkpoints, traces);
* ``--resume``: rank 0 picks the checkpoint, and every rank that cannot read those same files
  receives them over the process group, chunk by chunk, into a local cache
  (:func:`ship_checkpoint`). Ranks on rank 0's node (or on a shared file system) read them in
  place.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from srpo_graph.errors import ConfigError
from srpo_graph.train.parallel.collectives import all_reduce, broadcast_bytes
from srpo_graph.train.parallel.job import DistInfo

CHUNK = 64 << 20  # bytes of a checkpoint file broadcast at once


def _digest(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(hashlib.sha256(text.encode()).digest()), dtype=torch.uint8).clone()


def agree_config(config_json: str, workflow_source: str, dist: DistInfo, *, follow: bool = False) -> str:
    """Rank 0's config (JSON) on every rank, after checking that every rank resolved the same
    config (run folder aside: rank 0 decides it) and the same workflow source. A rank that
    ``follow``s (a resumed run on a node without the run folder, so without its config.toml)
    takes rank 0's config unchecked; its workflow source is still checked.

    Raises:
        ConfigError: on every rank at once, naming the ranks that differ from rank 0.
    """
    if not dist.enabled:
        return config_json
    import torch.distributed as dist_

    mine = json.loads(config_json)
    mine.pop("run_dir", None)
    config_digest = torch.zeros(32, dtype=torch.uint8) if follow else _digest(json.dumps(mine, sort_keys=True))
    local = torch.cat([config_digest, _digest(workflow_source)])
    every = [torch.empty_like(local) for _ in range(dist.world_size)]
    dist_.all_gather(every, local)
    config_off = [r for r, d in enumerate(every) if d[:32].any() and not torch.equal(d[:32], every[0][:32])]
    wf_off = [r for r, d in enumerate(every) if not torch.equal(d[32:], every[0][32:])]
    if config_off or wf_off:
        what = (([f"the training config (ranks {config_off})"] if config_off else [])
                + ([f"the .wf file's text (ranks {wf_off})"] if wf_off else []))
        raise ConfigError.at("multi-node job", f"the nodes of this job disagree with rank 0 on {' and '.join(what)}",
                             fix="start every node with the same command line, workflow and config (only "
                              "--node-rank differs)")
    return broadcast_bytes(config_json.encode() if dist.is_main else None, dist).decode()


def _listing(path: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*") if p.is_file())


def ship_checkpoint(chosen: Path | None, dist: DistInfo, cache: Path | None = None) -> Path | None:
    """The checkpoint folder rank 0 ``chosen``, readable on this rank: in place where this rank
    sees the same files (same names and sizes), else received over the process group into
    ``cache`` (default ``$SRPO_GRAPH_HOME/received/<run>-<hash>-<step>``, else under ``~/.cache/srpo-graph``), one
    chunk at a time.

    A collective: every rank calls it (``chosen`` matters on rank 0 only; None: no checkpoint,
    None on every rank).
    """
    if not dist.enabled:
        return chosen

    head = json.dumps({"path": str(chosen), "files": _listing(chosen)} if dist.is_main and chosen is not None else {})
    info = json.loads(broadcast_bytes(head.encode() if dist.is_main else None, dist).decode())
    if not info:  # rank 0 has no checkpoint to resume from (a run stopped before its first one)
        return None
    where, files = Path(info["path"]), [(str(n), int(s)) for n, s in info["files"]]
    have = where.is_dir() and _listing(where) == files
    if all_reduce(0 if have else 1, "sum", dist) == 0:
        return where
    home = (
        Path(os.environ["SRPO_GRAPH_HOME"])
        if os.environ.get("SRPO_GRAPH_HOME")
        else Path.home() / ".cache" / "srpo-graph"
    )
    tag = hashlib.sha256(str(where).encode()).hexdigest()[:10]
    local = (cache or home / "received") / f"{where.parent.parent.name}-{tag}-{where.name}"
    if not have:
        print(
            f"srpo-graph train: rank {dist.rank} cannot read {where} (the run folder is on rank 0's node); "
            f"receiving it into {local}",
            file=sys.stderr,
        )
    for name, size in files:
        out = None
        if not have:
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            out = open(local / name, "wb")
        src = open(where / name, "rb") if dist.is_main else None
        try:
            for _ in range(max(1, -(-size // CHUNK))):
                data = broadcast_bytes(src.read(CHUNK) if src is not None else None, dist)
                if out is not None:
                    out.write(data)
        finally:
            if src is not None:
                src.close()
            if out is not None:
                out.close()
    return where if have else local
