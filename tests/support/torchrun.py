"""Two-rank torchrun jobs of a test's own worker script, started as ``srpo-graph train --nproc``
starts its ranks: forked from a forkserver that has imported torch, transformers' modeling code and
the trainer once (Note [Ranks forked from a preloaded server], srpo_graph/train/parallel/forked.py).

The worker scripts (``tests/train/*_worker.py``) test the library in real gloo ranks; how a rank's
process starts is not their subject, and each new interpreter would import the same ~3.5 s again.
torchrun's ``--run-path`` runs the script's ``__main__`` in each forked rank; the script ends by
returning. A test whose subject is a process's own start or end runs ``torch.distributed.run``
itself.
"""

from __future__ import annotations

import sys

# torchrun through srpo-graph's wrapper (which preloads the forkserver), two ranks on this machine;
# then the script and its arguments
TWO_FORKED_RANKS = [sys.executable, "-m", "srpo_graph.train.parallel.launch", "--standalone", "--nproc_per_node=2",
                    "--run-path", "--start-method=forkserver"]
