"""Trainer stage: config, the RL loop, checkpoints, metrics, plots and data-parallel launch.

Consumes a ``.wf`` workflow and a :class:`~srpo_graph.train.config.TrainConfig`; produces a run
folder. Modules: ``config`` (TrainConfig, TOML, overrides), ``data`` (task files, task order,
workflow overrides), ``update`` (epochs x mini-batches x micro-batches on a SetBatch),
``trainer`` (``train``), ``checkpoint``, ``metrics``, ``plots``, ``progress``, ``distributed``,
``commands`` (``srpo-graph train``) and ``__main__`` (``torchrun -m srpo_graph.train``).
Heavy modules are not imported here, so ``import srpo_graph.train`` stays cheap.
"""
