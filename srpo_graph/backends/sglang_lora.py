"""SGLang for LoRA adapter policies: ONE server per shared base, one adapter per policy on it.

Backends stage. Consumes adapter views of models (they carry ``lora_name``: the adapter, or None
for the frozen base, ``lora_rank``, ``lora_targets`` and ``shared_base``: the object identifying
their base); produces the flags a base's server starts with (:func:`lora_flags`) and
:class:`SGLangAdapterBackend`, the client of one policy on that server. Which servers start, and
which policies share one, is ``sglang_fleet.py``'s plan (``serve_adapters``); this module
starts no process:

* the server starts with SGLang's LoRA support: ``--enable-lora --max-lora-rank R
  --lora-target-modules ...`` (the union over the base's adapters) ``--max-loras-per-batch``;
  on CPU also ``--lora-backend torch_native`` and a ``sitecustomize`` that makes host-memory
  pinning a no-op (SGLang 0.5.23's LoRA layers call ``pin_memory`` unconditionally, which a
  CPU-only torch refuses: docs/sglang.md);
* every request of an adapter policy names its adapter (``lora_path`` in ``/generate``); the
  frozen base's requests name none;
* ``sync_weights`` after an update saves the adapter (peft format) as
  ``weight_dir/<policy>/v<version>``, loads it under a new name ``<policy>@v<version>`` with
  ``/load_lora_adapter``, switches the policy's requests to it and unloads the previous name
  with ``/unload_lora_adapter``, so no request ever names a half-replaced adapter. The base's
  weights never change, so its ``sync_weights`` only records the version.

Note [Adapters sync by disk]
    Adapters reach the server as files (``/load_lora_adapter {lora_path}``), so the server must
    read ``rollout.sglang.weight_dir``; ``rollout.sglang.sync = "auto"`` means disk for them and
    ``"distributed"`` is refused. SGLang 0.5.23 has no other route that respects this project's
    rules (checked in its installed source):

    * the process-group route ends in ``WeightUpdater.load_weights_from_distributed``
      (``srt/model_executor/model_runner_components/weight_updater.py``), which calls
      ``self.get_model().load_weights(named_tensors)``: the base model's parameters only. Adapter
      weights live in the LoRA manager's memory pool (``srt/lora/lora_manager.py``), filled only
      by ``load_lora_adapter`` / ``load_lora_adapter_from_tensors``;
    * ``/load_lora_adapter_from_tensors`` (``srt/entrypoints/http_server.py``;
      ``LoadLoRAAdapterFromTensorsReqInput.serialized_named_tensors`` in
      ``srt/managers/io_struct.py``) takes the tensors as ``MultiprocessingSerializer`` payloads,
      i.e. pickles (``TpModelWorker.deserialize_own_rank`` in ``srt/managers/tp_worker.py`` ->
      ``MultiprocessingSerializer.deserialize`` -> ``SafeUnpickler`` in ``srt/utils/common.py``).
      Sending adapters that way means building a pickle of tensors, which this project does not
      do (no pickle for data; docs/architecture.md).

Completions are tagged with the backend's own weight version: the server's ``weight_version``
stays ``default`` (its base never changes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from srpo_graph.backends.sglang import SGLangBackend
from srpo_graph.errors import BackendError

# Written next to a CPU server's log and put first on its PYTHONPATH (Note in docs/sglang.md).
CPU_PIN_SHIM = '''\
"""srpo-graph: SGLang's LoRA path pins host memory unconditionally; a CPU-only torch refuses
(RuntimeError: pin_memory=True requires a CUDA or other accelerator backend). Pinning only
speeds up host-to-GPU copies, so on CPU it is made a no-op in this server process."""
import functools

import torch

torch.Tensor.pin_memory = lambda self, *a, **k: self


def _unpinned(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    return call


for _name in ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like"):
    setattr(torch, _name, _unpinned(getattr(torch, _name)))
'''


ADAPTERS_BY_DISK = ("SGLang 0.5.23 streams base-model weights only over a process group (its LoRA weights load "
                    "from a folder, or from pickled tensors, which this project never builds); the adapters go by "
                    "disk (docs/sglang.md, Note [Adapters sync by disk] in backends/sglang_lora.py)")


def is_adapter_policy(policy: Any) -> bool:
    """Whether a ``TrainedPolicy``'s model is a view of a shared LoRA base (``train/policies/lora.py``)."""
    return hasattr(getattr(policy, "model", None), "shared_base")


def lora_flags(models: Sequence[Any], cpu: bool) -> list[str]:
    """The server flags that serve the adapters of ``models`` (views of one base).

    >>> class M:  # a stand-in for train.lora.AdapterModel
    ...     def __init__(self, name, r, targets): self.lora_name, self.lora_rank, self.lora_targets = name, r, targets
    >>> lora_flags([M(None, 0, ()), M("a", 8, ("q_proj",)), M("b", 4, ("v_proj", "q_proj"))], cpu=False)
    ['--enable-lora', '--max-lora-rank', '8', '--lora-target-modules', 'q_proj', 'v_proj', '--max-loras-per-batch', '4']
    """
    adapters = [m for m in models if m.lora_name is not None]
    targets = sorted({t for m in adapters for t in m.lora_targets})
    # a policy briefly has two names loaded (the new version, then the old one unloaded)
    flags = ["--enable-lora", "--max-lora-rank", str(max(m.lora_rank for m in adapters)),
             "--lora-target-modules", *targets, "--max-loras-per-batch", str(2 * len(adapters))]
    return flags + (["--lora-backend", "torch_native"] if cpu else [])


class SGLangAdapterBackend(SGLangBackend):
    """An :class:`SGLangBackend` whose requests name one LoRA adapter of the server (or none).

    Args:
        url, tokenizer, kw: as :class:`SGLangBackend`.
        adapter: the policy's name (the adapter's name prefix), or None for the frozen base.
    """

    def __init__(self, url: str, tokenizer: Any, *, adapter: str | None, **kw: Any):
        super().__init__(url, tokenizer, **kw)
        self.adapter = adapter
        self.lora_name: str | None = None  # the name the server knows the current adapter by
        self.reports_weight_versions = False  # the server's version is its base's: "default"

    def payload(self, req) -> dict[str, Any]:
        body = super().payload(req)
        if self.adapter is not None:
            if self.lora_name is None:
                raise BackendError.at("sglang", f"adapter {self.adapter!r} was never loaded into the server",
                                      fix="call sync_weights(model, version) once before sampling")
            body["lora_path"] = self.lora_name
        return body

    def _version_of(self, meta: dict[str, Any]) -> int:
        return self.weight_version

    def sync_weights(self, model: Any, version: int) -> None:
        """Load ``model``'s adapter (a ``save_pretrained``-able view, or a peft folder) as the
        policy's adapter from now on, tagged ``version``; the frozen base only records it.

        Raises:
            BackendError: the server refuses to load the adapter.
        """
        version = int(version)
        if self.adapter is None:
            self.weight_version = version
            return
        if isinstance(model, (str, Path)):
            path = Path(model)
        else:  # the one ownership rule of weight_dir.py: never over, never deleting, a folder not this run's
            path = self.weights.claim(f"v{version}")
            model.save_pretrained(path)
        name, old = f"{self.adapter}@v{version}", self.lora_name
        if name == old:  # the same version again (a resume): replace it under its name
            self._lora_call("/unload_lora_adapter", {"lora_name": name})
            old = None
        self._lora_call("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        self.lora_name, self.weight_version = name, version
        if old is not None:
            self._lora_call("/unload_lora_adapter", {"lora_name": old})
            if not isinstance(model, (str, Path)):  # the previous version goes, if this run wrote it
                self.weights.keep_only({f"v{version}"})

    def _lora_call(self, route: str, body: dict[str, Any]) -> None:
        for worker in self.worker_urls:
            answer = self._post(worker, route, body)
            if not isinstance(answer, dict) or not answer.get("success", False):
                msg = answer.get("error_message") or answer.get("message") if isinstance(answer, dict) else answer
                raise BackendError(f"sglang: {worker} refused {route} {body.get('lora_name')!r}: {msg}")
