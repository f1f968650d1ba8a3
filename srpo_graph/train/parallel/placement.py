"""Trainer stage: where servers and trainer ranks go on the GPUs of one node (``train --plan``).

Consumes the number of GPUs and the workflow's trainable policies (name, model); produces a
:class:`Plan` -- which GPUs serve which policy (SGLang), which GPUs train (torchrun ranks) --
and the commands that start them. Pure logic: nothing is started, no GPU is needed.

The rule (the common one of verl / slime / OpenRLHF when not colocating):

* 1 GPU: everything shares GPU 0; each server's ``--mem-fraction-static`` is its share of 0.5
  (the trainer keeps the other half).
* G >= 2: rollout and training split the GPUs, the larger half to the trainer when G is odd
  (updates are the heavier stage at equal batch); the rollout GPUs are dealt out to policies
  round robin, so a policy gets ``--tp``/``--dp`` GPUs of its own when there are as many as
  policies, and policies share a GPU (memory fraction split) when there are fewer.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class ServerPlan:
    """One SGLang server: a policy's model on some GPUs."""

    policy: str
    model: str
    gpus: tuple[int, ...]
    port: int
    mem_fraction: float

    def command(self) -> str:
        dp = f" --dp-size {len(self.gpus)}" if len(self.gpus) > 1 else ""
        return (f"CUDA_VISIBLE_DEVICES={','.join(map(str, self.gpus))} python -m sglang.launch_server "
                f"--model-path {shlex.quote(self.model)} --host 0.0.0.0 --port {self.port}{dp} "
                f"--mem-fraction-static {self.mem_fraction:.2f} --enable-custom-logit-processor")


@dataclass(frozen=True)
class Plan:
    gpus: int
    servers: tuple[ServerPlan, ...]
    trainer_gpus: tuple[int, ...]
    train_args: tuple[str, ...] = field(default=())

    def commands(self, workflow: str) -> list[str]:
        urls = ", ".join(f'{s.policy} = "http://127.0.0.1:{s.port}"' for s in self.servers)
        train = (
            f"CUDA_VISIBLE_DEVICES={','.join(map(str, self.trainer_gpus))} srpo-graph train {shlex.quote(workflow)} "
            f"--nproc {len(self.trainer_gpus)} rollout.backend=sglang rollout.device=cuda "
            f"'rollout.sglang.urls={{{urls}}}'" + "".join(f" {shlex.quote(a)}" for a in self.train_args)
        )
        return [s.command() + " &" for s in self.servers] + [train]

    def table(self) -> str:
        lines = [f"{'GPU':>4}  role"]
        for g in range(self.gpus):
            roles = [f"serves {s.policy}" for s in self.servers if g in s.gpus]
            roles += ["trains"] if g in self.trainer_gpus else []
            lines.append(f"{g:>4}  {', '.join(roles)}")
        return "\n".join(lines)


def plan(gpus: int, policies: Sequence[tuple[str, str]], *, port: int = 30000, train_args: Sequence[str] = ()) -> Plan:
    """Place one SGLang server per policy and the trainer ranks on ``gpus`` GPUs of one node.

    >>> p = plan(8, [("solver", "Qwen/Qwen3-4B"), ("judge", "Qwen/Qwen3-1.7B")])
    >>> [(s.policy, s.gpus) for s in p.servers], p.trainer_gpus
    ([('solver', (0, 2)), ('judge', (1, 3))], (4, 5, 6, 7))
    >>> print(plan(1, [("a", "m")]).table())
     GPU  role
       0  serves a, trains
    """
    if gpus < 1:
        raise ValueError(f"--gpus: {gpus} is not >= 1")
    if not policies:
        raise ValueError("the workflow has no trainable policy to place")
    if gpus == 1:
        share = 0.5 / len(policies)
        return Plan(
            1,
            tuple(ServerPlan(n, m, (0,), port + i, share) for i, (n, m) in enumerate(policies)),
            (0,),
            tuple(train_args),
        )
    rollout = list(range(gpus // 2))
    trainer = tuple(range(gpus // 2, gpus))
    owned: dict[int, list[int]] = {i: [] for i in range(len(policies))}
    for k, g in enumerate(rollout):  # GPUs dealt out to policies round robin
        owned[k % len(policies)].append(g)
    sharers: dict[int, int] = {}
    for i in owned:
        if not owned[i]:  # fewer rollout GPUs than policies: share, round robin
            owned[i] = [rollout[i % len(rollout)]]
        for g in owned[i]:
            sharers[g] = sharers.get(g, 0) + 1
    servers = tuple(
        ServerPlan(n, m, tuple(owned[i]), port + i, round(0.85 / max(sharers[g] for g in owned[i]), 2))
        for i, (n, m) in enumerate(policies)
    )
    return Plan(gpus, servers, trainer, tuple(train_args))
