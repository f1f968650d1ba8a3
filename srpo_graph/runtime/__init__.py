"""Runtime stage: run a checked workflow on tasks and record every episode as a trace.

Consumes a :class:`~srpo_graph.workflow.Workflow`, task files and one backend per policy;
produces :class:`~srpo_graph.runtime.trace.Episode` traces (JSONL). Its verb is
``executor.run``; it knows nothing of compiling or training.

The modules:

* ``executor.py``: ``run``, the one entry point: sets a run up and picks its scheduler;
  ``RunResult``, ``RunStats``;
* ``lockstep.py``: the lockstep scheduler (one batch of every live episode per round, for
  in-process backends); ``streaming.py``: the streaming scheduler (each episode on its own as its
  answers return, for servers);
* ``requests.py``: what both schedulers share: requests batched per backend with their seeds,
  sampling, the answers checked and handed back;
* ``seeds.py``: every random stream of a run (episode and output seeds, the trainer's per-step
  rollout, shuffling, task order and evaluation seeds), each by one named function;
* ``episode.py``: one episode's state machine (``lang/firing.py``'s rule);
  ``usercode.py``: tools, rewards and extractors off the main thread with deadlines;
* ``prompts.py`` (per-agent sampling plans), ``chat.py`` (chat agents' conversations),
  ``render.py`` (references and templates);
* ``trace.py`` (the trace schema and its JSONL files), ``jsonl.py`` (the one JSONL reader),
  ``tasks.py`` and ``hf_tasks.py`` (task files), ``tokens.py`` (``check``'s token rule);
* ``show.py`` and ``episode_view.py`` (``show``), ``commands.py`` (``run``, ``show``, ``init-model``).
"""
