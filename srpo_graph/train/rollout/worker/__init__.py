"""Trainer stage, rollouts: the rollout worker, sampling for the transformers backend in a process of its own.

Modules: ``client.py`` (``RolloutWorker`` in the trainer: start, batches, weight pushes, deadlines;
``WorkerPolicy``, the slots' backend), ``main.py`` (the worker process: its policies, the executor,
weights received; exits with its trainer), ``wire.py`` (JSON frames with deadlines over a local
socket, a two-rank gloo group for the weights).
"""
