"""Trainer stage, learning (stage 2 of the loop): compile the step's episodes and update the policies.

Modules: ``step.py`` (``Learner``: compile -> old log-probs -> update, a ``LearnResult``),
``update.py`` (epochs x mini-batches x micro-batches; non-finite steps skipped or rolled back),
``across_ranks.py`` (under ``--nproc N``, the loss diagnostics of the whole batch from every rank's).
How the work is split over processes is ``parallel/strategies.py``; the sync of the new weights
is ``train/sync.py``.
"""
