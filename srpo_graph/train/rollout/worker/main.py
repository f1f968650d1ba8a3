"""Trainer stage, rollout worker: the worker process itself (``python -m srpo_graph.train.rollout.worker.main``).

Started by :class:`~srpo_graph.train.rollout.worker.client.RolloutWorker`, never by a user. It holds its
own copy of every policy of the workflow (full models from their model paths, LoRA adapters on
their own shared frozen base, frozen and external policies as the trainer would build them), each
sampled by a :class:`~srpo_graph.backends.transformers.TransformersBackend`, and serves, one at a
time, the requests of the control connection (``wire.py``):

* ``run``: a whole rollout batch through ``runtime.executor.run``; episodes back as JSON lines;
* ``weights``: a policy's tensors, received bucket by bucket over the gloo group and copied into
  its model (full policies: every weight; adapters: the adapter's own matrices), then its version;
* ``close``: exit.

It never outlives the trainer: a watchdog thread ends it when its stdin (a pipe from the trainer)
reaches end-of-file or its parent changes, and the control connection closing ends it too.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

import torch

from srpo_graph.errors import BackendError, SrpoGraphError
from srpo_graph.train.rollout.worker.wire import broadcast_options, join_as_receiver, recv, send, unflatten

TOKEN_ENV = "SRPO_GRAPH_WORKER_TOKEN"
ORPHANED = 70  # the exit code of a worker whose trainer went away


def _watch_parent(ppid: int) -> None:
    """End this process when the trainer is gone (its pipe closed, or this process re-parented)."""
    fd = sys.stdin.fileno() if sys.stdin is not None else None
    while True:
        if fd is not None:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready and not os.read(fd, 4096):
                os._exit(ORPHANED)
        else:
            threading.Event().wait(1.0)
        if os.getppid() != ppid:
            os._exit(ORPHANED)


class Worker:
    """The policies this process samples from, and their weight versions."""

    def __init__(self, wf: Any, options: dict[str, Any]):
        self.backends, self.targets = load_policies(wf, options)
        self.versions = {p.name: 0 for p in wf.policies}
        self.workflows: dict[str, Any] = {}  # workflow JSON -> Workflow (the train and eval variants)

    def run(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        from srpo_graph.runtime.executor import run as run_episodes
        from srpo_graph.runtime.tasks import Task
        from srpo_graph.runtime.usercode import Deadlines
        from srpo_graph.workflow import Workflow

        text = header["workflow"]
        wf = self.workflows.get(text)
        if wf is None:
            wf = self.workflows[text] = Workflow.model_validate_json(text)
        requested = header.get("policy_versions") or {}
        wrong = {n: (self.versions.get(n), v) for n, v in requested.items() if self.versions.get(n) != v}
        if wrong:
            raise BackendError("asked to sample at weight versions it does not hold: " + ", ".join(
                f"policy {n!r} holds version {held}, asked for {v}" for n, (held, v) in sorted(wrong.items())))
        res = run_episodes(wf, [Task.model_validate(t) for t in header["tasks"]], self.backends,
                           samples=int(header["samples"]), seed=int(header["seed"]),
                           policy_versions=dict(self.versions), on_backend_error=header["on_backend_error"],
                           deadlines=Deadlines.model_validate(header["deadlines"]), scheduler=header["scheduler"],
                           max_concurrent=header.get("max_concurrent"))
        lines = "\n".join(ep.to_json() for ep in res.episodes).encode()
        return {"ok": True, "stats": res.stats.model_dump(mode="json")}, lines

    def weights(self, sock: socket.socket, pg: Any, header: dict[str, Any]) -> dict[str, Any]:
        """Receive one policy's buckets until ``end``; every bucket is received even after a bad name,
        so the trainer's broadcast never waits on a worker that gave up."""
        policy = header["policy"]
        targets = self.targets.get(policy)
        problems: list[str] = []
        if targets is None:
            problems.append(f"policy {policy!r} is not trained here (trained: {sorted(self.targets)})")
        received = 0
        while True:
            h, _ = recv(sock, what="the trainer")
            if h["op"] == "end":
                break
            buf = torch.empty(int(h["nbytes"]), dtype=torch.uint8)
            pg.broadcast([buf], broadcast_options()).wait()
            with torch.no_grad():
                for name, t in unflatten(buf, h):
                    dst = (targets or {}).get(name)
                    if dst is None or tuple(dst.shape) != tuple(t.shape):
                        problems.append(f"{name} {tuple(t.shape)}")
                        continue
                    dst.copy_(t)
                    received += 1
        if problems:
            return {"ok": False, "error": f"weights of policy {policy!r} do not fit its model here: "
                    + ", ".join(problems[:5]) + (f" and {len(problems) - 5} more" if len(problems) > 5 else "")}
        self.versions[policy] = int(header["version"])
        self.backends[policy].weight_version = int(header["version"])
        return {"ok": True, "tensors": received}


def load_policies(wf: Any, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """A backend per policy of ``wf``, built as the trainer builds its own (``policies/build.py``,
    ``lora.build_slots``, ``frozen.load_frozen``), and per trained policy the tensors a weight push
    writes into, by the names the trainer sends (a full model's state dict; an adapter's parameters)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from srpo_graph.backends.openai import OpenAIBackend
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models import resolve_model
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.train.policies.lora import AdapterModel, SharedBase

    hf_logging.disable_progress_bar()
    dtype, device = getattr(torch, options["dtype"]), options["device"]
    by_name = wf.policy_by_name
    order = [p.name for p in wf.policies]
    bases = {}
    for base_name in sorted(wf.frozen_bases, key=order.index):
        adapters = [p for p in wf.policies if p.adapter is not None and p.adapter.base == base_name]
        bases[base_name] = SharedBase(resolve_model(by_name[base_name].model), adapters, dtype=dtype, device=device)
    backends: dict[str, Any] = {}
    targets: dict[str, dict[str, torch.Tensor]] = {}
    for pol in wf.policies:
        if pol.external is not None:
            backends[pol.name] = OpenAIBackend.for_policy(pol.external)
            continue
        shared = bases.get(pol.adapter.base if pol.adapter is not None else pol.name)
        model: Any
        if shared is not None:
            model = AdapterModel(shared, pol.name if pol.adapter is not None else None)
            tok = load_tokenizer(shared.path)
            if pol.adapter is not None:
                targets[pol.name] = {n: p.data for n, p in model.named_parameters()}
            else:
                targets[pol.name] = {}  # a frozen base has a slot: its version moves with the step, its weights never
        else:
            path = resolve_model(pol.model)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
            tok = load_tokenizer(path)
            # requires_grad as in the trainer (trained: on; frozen: off, frozen.load_frozen): CPU kernels
            # differ in the last bit with it, and the worker must sample exactly what the trainer would
            if pol.name in wf.untrained_policies:
                model.requires_grad_(False)
            else:
                targets[pol.name] = model.state_dict()
        backends[pol.name] = TransformersBackend(model, tok, device=device, max_batch_size=options["max_batch_size"])
    return backends, targets


def serve(sock: socket.socket, pg: Any, worker: Worker) -> None:
    """Answer requests until ``close`` (or the trainer's end of the connection closes)."""
    while True:
        try:
            header, _ = recv(sock, what="the trainer")
        except BackendError:  # the trainer closed the connection: nothing left to serve
            return
        op = header.get("op")
        payload = b""
        try:
            if op == "run":
                answer, payload = worker.run(header)
            elif op == "weights":
                answer = worker.weights(sock, pg, header)
            elif op == "close":
                send(sock, {"ok": True})
                return
            else:
                answer = {"ok": False, "error": f"unknown request {op!r}"}
        except SrpoGraphError as exc:
            answer = {"ok": False, "error": str(exc).strip(), "kind": type(exc).__name__}
        except Exception as exc:  # anything else is a bug in the worker: its traceback travels back
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                      "kind": type(exc).__name__}
        send(sock, answer, payload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srpo_graph.train.rollout.worker.main")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and closes the worker
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="srpo-parent-watch").start()
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=60)
    sock.settimeout(None)
    send(sock, {"op": "hello", "token": os.environ.get(TOKEN_ENV, ""), "pid": os.getpid()})
    start, _ = recv(sock, what="the trainer")
    torch.set_num_threads(int(start["threads"]))
    group = start["group"]
    try:
        pg = join_as_receiver(group["address"], int(group["port"]), group["name"], float(start["timeout"]))
        from srpo_graph.workflow import Workflow

        worker = Worker(Workflow.model_validate_json(start["workflow"]), start["options"])
    except Exception as exc:  # a model that does not load, a group that does not form: said, then exit
        send(sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    send(sock, {"ok": True, "pid": os.getpid()})
    serve(sock, pg, worker)
    return 0


if __name__ == "__main__":
    from srpo_graph import exiting

    exiting.as_entry_point()
    status = main()
    exiting.end(status)  # it joined the weight group: Note [A process in a group ends without finalizing]
    sys.exit(status)
