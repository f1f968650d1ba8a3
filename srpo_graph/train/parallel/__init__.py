"""Trainer stage, parallel: one process, several, several nodes (torchrun, DDP and FSDP2 arithmetic).

Modules: ``job.py`` (``DistInfo``, this process's place in the job, torch-free), ``collectives.py``
(the process group, byte broadcasts and gathers, one
``all_reduce(value, op)``, bucketed gradient all-reduce, event shards; every collective under the
group's deadline), ``strategies.py`` (``STRATEGIES``: how the update runs on one or many
processes), ``fsdp.py`` (sharding, matching forwards, full state dicts), ``gather.py`` (an FSDP
model's weights gathered one tensor at a time), ``multinode.py`` (rank 0's config on every node,
checkpoints shipped to nodes without the run folder), ``launch.py`` (torchrun's command line, the
launcher and the wrapper torchrun runs as), ``forked.py`` (each rank forked from a forkserver that
imported torch and the trainer once), ``placement.py`` (``train --plan``: servers and
trainer ranks over the GPUs of one node). Nothing here knows workflows or losses.
"""
