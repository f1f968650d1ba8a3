"""Trainer stage: per-transition reward means and per-route-label statistics of one step's episodes.

Consumes the workflow and the step's :class:`~srpo_graph.runtime.trace.Episode`\\ s; produces the
metric names the trainer logs (``metrics.jsonl``, TensorBoard, ``plots/transition_rewards.png``
and ``plots/routes.png``):

* ``reward/<transition>`` -- the mean of that transition's own ``reward:`` over its firings
  (transitions with a reward only);
* ``reward/<transition>/<label>`` -- the same, over the firings of a router that chose
  ``label`` (a ``choices`` router's firing counts for each label it chose);
* ``route/<transition>/<label>`` -- the share of a router's firings that chose ``label``
  (sums to 1 for a ``choice`` router; to the mean subset size for ``choices``);
* ``route_return/<transition>/<label>`` -- the mean episode reward of the episodes in which
  the router chose ``label`` at least once (what a route led to, for routers without a reward).

A firing whose route subject had no value (it activated ``end``) counts under the label
``none``. The label is read back from the trace (:func:`~srpo_graph.runtime.episode_view.route_labels`).
"""

from __future__ import annotations

from collections import defaultdict

from srpo_graph.runtime.episode_view import route_labels
from srpo_graph.runtime.trace import Episode
from srpo_graph.workflow import Workflow

NO_LABEL = "none"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def transition_metrics(workflow: Workflow, episodes: list[Episode]) -> dict[str, float]:
    """The per-transition and per-route-label metrics of ``episodes`` (module docstring).

    >>> transition_metrics(None, [])
    {}
    """
    rewards: dict[str, list[float]] = defaultdict(list)
    by_label: dict[tuple[str, str], list[float]] = defaultdict(list)
    picks: dict[tuple[str, str], int] = defaultdict(int)
    firings: dict[str, int] = defaultdict(int)
    returns: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ep in episodes:
        chosen: set[tuple[str, str]] = set()
        for rec in ep.transitions:
            if rec.reward is not None:
                rewards[rec.name].append(rec.reward)
            labels = route_labels(workflow, ep, rec)
            if labels is None:
                continue
            firings[rec.name] += 1
            for label in labels or [NO_LABEL]:
                picks[(rec.name, label)] += 1
                chosen.add((rec.name, label))
                if rec.reward is not None:
                    by_label[(rec.name, label)].append(rec.reward)
        for key in chosen:
            returns[key].append(ep.reward)
    out: dict[str, float] = {}
    for name, values in sorted(rewards.items()):
        out[f"reward/{name}"] = _mean(values)
    for (name, label), values in sorted(by_label.items()):
        out[f"reward/{name}/{label}"] = _mean(values)
    for (name, label), n in sorted(picks.items()):
        out[f"route/{name}/{label}"] = n / firings[name]
    for (name, label), values in sorted(returns.items()):
        out[f"route_return/{name}/{label}"] = _mean(values)
    return out
