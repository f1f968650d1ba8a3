"""Trainer stage, policies: the models the run trains or samples without training.

Modules: ``slot.py`` (``PolicySlot``: one trained policy's model, optimizer, scheduler, backend and
weight version; the optimizer and LR schedule), ``build.py`` (the trained policies built from the
config: from their models or a checkpoint, sharded under fsdp), ``lora.py`` (LoRA adapters on one
shared frozen base; export), ``frozen.py`` (frozen and external policies: never updated, a pointer
in checkpoints), ``precision.py`` (the update's bf16 autocast and gradient checkpointing).
"""
