"""Trainer stage, rollouts (stage 1 of the loop): each step's episodes.

Modules: ``tasks.py`` (task files, the seeded task order, the workflow as the run uses it),
``lockstep.py`` (``rollout``: one batch on every rank or on rank 0; ``Rollouts``, the synchronous
stage owning its task cursor), ``overlapped.py`` (``AsyncRollouts``: batches of later steps sampled
while the loop updates, staleness bounded by ``rollout.max_staleness``), ``gate.py`` (requests in
flight vs weight syncs), ``ranks.py`` (every rank samples its share), ``backends.py`` (the
backends attached to the policies, servers' lifetime, backend loss defaults), ``failures.py`` (the
failure budget), ``worker/`` (the rollout worker process for the transformers backend).
"""
