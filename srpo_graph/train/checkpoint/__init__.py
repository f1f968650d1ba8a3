"""Trainer stage, checkpoints (stage 5 of the loop): atomic, checksummed run checkpoints, verified by every reader.

Modules (each imports only those above it):

* ``layout.py`` -- the generic layer: ``RUN_DIR/checkpoints/step_N/``, :class:`LoopState`, the
  atomic finish (manifest, fsync, rename), ``verify_files``; it never imports a format;
* ``full.py`` -- the ``full`` format: each policy whole (``save_pretrained`` + safetensors);
* ``agree.py`` -- every rank of a job leaves a save alike (a full disk on any rank stops them all);
* ``sharded.py`` -- the ``dcp`` format under fsdp (``torch.distributed.checkpoint`` shards),
  ``consolidate``;
* ``checkpointer.py`` -- ``FORMATS`` (the table of formats), ``verify_checkpoint``,
  ``latest_good_checkpoint``, ``load_checkpoint`` and the :class:`Checkpointer` the loop calls.

The names below are the stage's public API (``from srpo_graph.train import checkpoint``).
"""

from srpo_graph.train.checkpoint.checkpointer import (
    FORMATS,
    Checkpointer,
    enclosing_checkpoint,
    format_of,
    latest_good_checkpoint,
    load_checkpoint,
    open_checkpoint,
    verified_model_path,
    verify_checkpoint,
)
from srpo_graph.train.checkpoint.full import save_checkpoint
from srpo_graph.train.checkpoint.layout import (
    COMPLETE,
    LoopState,
    checkpoint_dirs,
    disk_full,
    latest_checkpoint,
    policy_path,
)
from srpo_graph.train.checkpoint.sharded import consolidate, is_sharded_checkpoint

__all__ = ["COMPLETE", "FORMATS", "Checkpointer", "LoopState", "checkpoint_dirs", "consolidate", "disk_full",
           "enclosing_checkpoint", "format_of", "is_sharded_checkpoint", "latest_checkpoint", "latest_good_checkpoint",
           "load_checkpoint", "open_checkpoint", "policy_path", "save_checkpoint", "verified_model_path",
           "verify_checkpoint"]
