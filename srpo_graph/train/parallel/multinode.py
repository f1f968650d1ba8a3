"""Trainer stage: a job over several nodes (torchrun, static rendezvous) with no shared file system.

Consumes :class:`~srpo_graph.train.parallel.collectives.DistInfo`, the resolved config and the workflow
source of each rank; produces the torchrun command line of one node, one config every rank
agrees on, and the checkpoint a resumed run starts from on every node.

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
from typing import Sequence

import torch

from srpo_graph import exiting
from srpo_graph.errors import ConfigError
from srpo_graph.train.parallel.collectives import DistInfo, broadcast_bytes

CHUNK = 64 << 20  # bytes of a checkpoint file broadcast at once


def torchrun_command(nproc: int, argv: Sequence[str], *, nnodes: int = 1, node_rank: int = 0,
                     endpoint: str | None = None, timeout: float = 600.0) -> list[str]:
    """The torchrun command line of one node: ``--standalone`` on one node; several nodes meet at
    ``endpoint`` (``HOST:PORT`` of node 0, static rendezvous: node K's ranks are K*nproc..), each
    waiting at most ``timeout`` seconds for the others (a node that never comes ends the job).

    torchrun runs through :func:`main` below, which exits with the failed rank's own exit code
    and without torchrun's traceback (the rank has printed its error already).

    >>> torchrun_command(2, ["a.wf"])[-5:]
    ['--standalone', '--nproc_per_node=2', '-m', 'srpo_graph.train', 'a.wf']
    >>> torchrun_command(1, ["a.wf"], nnodes=2, node_rank=1, endpoint="10.0.0.1:29500")[-9:-3]
    ['--nnodes=2', '--node_rank=1', '--master_addr=10.0.0.1', '--master_port=29500', '--rdzv_conf=timeout=600', '--nproc_per_node=1']
    """
    cmd = [sys.executable, "-m", "srpo_graph.train.parallel.multinode"]
    if nnodes <= 1:
        cmd += ["--standalone"]
    else:
        if not endpoint or ":" not in endpoint:
            raise ConfigError(f"--rdzv-endpoint: {endpoint!r} is not HOST:PORT (node 0's address and a free port); "
                              f"every one of the {nnodes} nodes passes the same value")
        if not 0 <= node_rank < nnodes:
            raise ConfigError(f"--node-rank: {node_rank} is not in 0..{nnodes - 1}")
        host, port = endpoint.rsplit(":", 1)
        cmd += [f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--master_addr={host}", f"--master_port={port}",
                f"--rdzv_conf=timeout={int(timeout)}"]
    return cmd + [f"--nproc_per_node={nproc}", "-m", "srpo_graph.train", *argv]


def _digest(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(hashlib.sha256(text.encode()).digest()), dtype=torch.uint8).clone()


FOLLOW_ENV = "SRPO_GRAPH_FOLLOW_RANK0"  # set by `train --resume` on a node that cannot read the run folder


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
    ``cache`` (default ``$SRPO_GRAPH_HOME/received/<run>-<hash>-<step>``, else under ``~/.cache/srpo-graph``), one chunk at a time.

    A collective: every rank calls it (``chosen`` matters on rank 0 only; None: no checkpoint,
    None on every rank).
    """
    if not dist.enabled:
        return chosen
    import torch.distributed as dist_

    head = json.dumps({"path": str(chosen), "files": _listing(chosen)} if dist.is_main and chosen is not None else {})
    info = json.loads(broadcast_bytes(head.encode() if dist.is_main else None, dist).decode())
    if not info:  # rank 0 has no checkpoint to resume from (a run stopped before its first one)
        return None
    where, files = Path(info["path"]), [(str(n), int(s)) for n, s in info["files"]]
    have = where.is_dir() and _listing(where) == files
    missing = torch.tensor([0 if have else 1], dtype=torch.int64)
    dist_.all_reduce(missing, op=dist_.ReduceOp.SUM)
    if int(missing.item()) == 0:
        return where
    home = Path(os.environ["SRPO_GRAPH_HOME"]) if os.environ.get("SRPO_GRAPH_HOME") else Path.home() / ".cache" / "srpo-graph"
    tag = hashlib.sha256(str(where).encode()).hexdigest()[:10]
    local = (cache or home / "received") / f"{where.parent.parent.name}-{tag}-{where.name}"
    if not have:
        print(f"srpo-graph train: rank {dist.rank} cannot read {where} (the run folder is on rank 0's node); "
              f"receiving it into {local}", file=sys.stderr)
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


def main(argv: Sequence[str]) -> int:
    """torchrun with ``argv``; a failed rank's exit code, without torchrun's own traceback."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(list(argv)))
    except SignalException as exc:  # SIGTERM / Ctrl-C: torchrun has passed it to the ranks, which said where the run stands
        exiting.decided()  # torchrun's handler raises SignalException: not into the exit (exiting.py)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        exiting.decided()
        rank, failure = exc.get_first_failure()
        code = int(failure.exitcode)
        if code < 0:  # killed by a signal: say which rank, the ranks that saw it have said the rest
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else "?"
            print(f"srpo-graph train: rank {rank} (pid {failure.pid}) was killed by signal {-code} ({name})",
                  file=sys.stderr)
            return 128 - code
        return code or 1
    exiting.decided()
    return 0


if __name__ == "__main__":
    exiting.as_entry_point()
    sys.exit(main(sys.argv[1:]))
