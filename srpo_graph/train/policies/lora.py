"""Trainer stage: LoRA adapter policies on one shared, frozen base (``policy p = lora("base", ...)``).

Consumes a checked :class:`~srpo_graph.workflow.Workflow` whose policies include adapters and
the run's config; produces the trainer's per-policy slots, where every adapter on one base
shares ONE base model in memory:

* each base is loaded once and wrapped by peft with one named adapter per adapter policy; its
  weights are frozen (``requires_grad=False``), only the ``lora_A``/``lora_B`` matrices train;
* each policy sees the shared model through an :class:`AdapterModel`, which activates its own
  adapter (or none: the frozen base) before every forward. Both the sampler (the transformers
  backend) and the trainer call that view, so the log-probs of record and the recomputed ones
  come from the same computation;
* one AdamW per adapter, over that adapter's parameters only; an event whose members use two
  adapters back-propagates into both (each member's forward ran with its own adapter);
* a checkpoint holds each adapter in the peft format (``adapter_model.safetensors`` +
  ``adapter_config.json``), never the base; resume loads them back into a fresh base;
* :func:`export_adapter` merges an adapter into its base (``merge_and_unload``) and writes a
  full model folder.

Departure from peft's own switching: ``PeftModel.set_adapter`` also flips ``requires_grad``
(only the active adapter trains), which would cut the gradient of the other adapters of a
joint event; :meth:`AdapterModel._activate` sets only the active-adapter flags of the LoRA
layers. The executor samples on one thread, so the switch is never raced.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from srpo_graph.errors import ConfigError
from srpo_graph.train import checkpoint as ckpt
from srpo_graph.train.config.refusals import check_strategy
from srpo_graph.train.policies.slot import PolicySlot, make_optimizer
from srpo_graph.workflow import Policy, Workflow

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names
ADAPTER_CONFIG = "adapter_config.json"
FROZEN_MARKER = "frozen_base.json"  # a frozen base policy's checkpoint folder: no weights, a pointer


def uses_adapters(wf: Workflow) -> bool:
    """Whether any policy of ``wf`` is a LoRA adapter."""
    return any(p.adapter is not None for p in wf.policies)


def lora_config(pol: Policy, task_type: str = "CAUSAL_LM"):
    """The peft ``LoraConfig`` of an adapter policy."""
    from peft import LoraConfig

    a = pol.adapter
    assert a is not None
    return LoraConfig(r=a.r, lora_alpha=a.alpha,  # type: ignore[arg-type]  # peft annotates int, accepts float target_modules=list(a.targets), lora_dropout=a.dropout,
                      bias="none", task_type=task_type)


class SharedBase:
    """One base model in memory with every adapter declared on it (peft, one name per policy).

    Args:
        path: the base model to load (``from_pretrained``).
        adapters: the adapter policies on this base, in declaration order.
        dtype, device: as the trainer's rollout config says.
        resume_from: a checkpoint whose ``policies/<name>/`` adapter weights are loaded.
    Raises:
        ConfigError: a target module the architecture lacks (peft's message), a damaged adapter.
    """

    def __init__(self, path: str, adapters: list[Policy], *, dtype: torch.dtype, device: str,
                 resume_from: Path | None = None):
        from peft import get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        self.path = path
        base: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        base = base.to(device).eval()
        base.requires_grad_(False)
        try:
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            first, *rest = adapters
            self.peft = get_peft_model(base, lora_config(first), adapter_name=first.name)
            for pol in rest:
                self.peft.add_adapter(pol.name, lora_config(pol))
        except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
            raise ConfigError.at(f"policy {first.name!r}", f"cannot put LoRA adapters on {path}: {exc}",
                                 fix="name modules of that architecture in `targets`") from None
        self.peft.to(device).eval()
        self.inner = self.peft.get_base_model()  # the transformers model with LoRA layers injected
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.layers = [m for m in self.inner.modules() if isinstance(m, BaseTunerLayer)]
        self.names = [p.name for p in adapters]
        for name, p in self.peft.named_parameters():  # base frozen, every adapter trainable
            p.requires_grad_(any(_owns(name, a) for a in self.names))
        if resume_from is not None:
            for pol in adapters:
                f = Path(resume_from) / "policies" / pol.name / ADAPTER_WEIGHTS
                try:
                    res: Any = set_peft_model_state_dict(
                        self.peft, load_file(f, device=str(device)), adapter_name=pol.name
                    )
                except Exception as exc:  # safetensors/peft raise their own types for damaged files
                    raise ConfigError.at(str(f), f"adapter does not load ({type(exc).__name__}: {exc})") from None
                missing = [k for k in res.missing_keys if _owns(k, pol.name)]
                if missing or res.unexpected_keys:
                    raise ConfigError.at(
                        str(f),
                        f"adapter {pol.name!r} does not match the workflow's lora(...) "
                        f"(missing {missing[:3]}, unexpected {list(res.unexpected_keys)[:3]})",
                        fix="resume with the .wf file the run was started with",
                    )

    def adapter_parameters(self, name: str) -> list[torch.nn.Parameter]:
        """The trainable parameters of adapter ``name`` (its lora_A / lora_B matrices)."""
        return [p for n, p in self.peft.named_parameters() if _owns(n, name)]

    def activate(self, name: str | None) -> None:
        """Run the next forwards with adapter ``name`` (None: the frozen base, every adapter off)."""
        for m in self.layers:
            m._disable_adapters = name is None
            if name is not None:
                m._active_adapter = [name]


class AdapterModel:
    """One policy's view of a :class:`SharedBase`: what the trainer and the sampler call.

    Quacks like the causal LM the rest of the trainer expects (``forward``/``__call__``,
    ``parameters``, ``modules``, ``config``, ``save_pretrained``); ``parameters()`` are the
    adapter's own (for the frozen base: the base's, none of which requires grad), so gradient
    clipping, non-finite checks and the optimizer see one policy only.
    """

    def __init__(self, shared: SharedBase, adapter: str | None):
        self.shared, self.adapter = shared, adapter
        self.config = shared.inner.config
        # what a server-side backend needs to serve the adapter (backends/sglang_lora.py)
        self.shared_base, self.lora_name = shared, adapter
        cfg = shared.peft.peft_config.get(adapter) if adapter is not None else None
        self.lora_rank = cfg.r if cfg is not None else 0
        self.lora_targets = tuple(sorted(cfg.target_modules)) if cfg is not None else ()
        self._cache_kw = "cache" if "cache" in _forward_params(shared.inner) else "past_key_values"

    # transformers' names, so callers that inspect the signature (logits_to_keep, the KV cache) see them
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        self.shared.activate(self.adapter)
        if cache is not None:
            kwargs[self._cache_kw] = cache
        if logits_to_keep is not None and not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            kwargs["logits_to_keep"] = logits_to_keep
        return self.shared.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, **kwargs
        )

    __call__ = forward

    def named_parameters(self):
        if self.adapter is None:
            return ((n, p) for n, p in self.shared.inner.named_parameters() if "lora_" not in n)
        keep = {id(p) for p in self.shared.adapter_parameters(self.adapter)}
        return ((n, p) for n, p in self.shared.peft.named_parameters() if id(p) in keep)

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def modules(self):
        return self.shared.inner.modules()

    def get_output_embeddings(self):
        return self.shared.inner.get_output_embeddings()

    def to(self, device):
        self.shared.peft.to(device)
        return self

    def eval(self):
        self.shared.peft.eval()
        return self

    def train(self, mode: bool = True):
        self.shared.peft.train(mode)
        return self

    def save_pretrained(self, path: str | Path, safe_serialization: bool = True) -> None:
        """The adapter in the peft format (``adapter_model.safetensors`` + ``adapter_config.json``);
        the frozen base writes only a pointer to its model (it never changes)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.adapter is None:
            (path / FROZEN_MARKER).write_text(json.dumps({"model": self.shared.path, "adapters": self.shared.names}))
            save_file({}, path / "frozen_base.safetensors")  # no weights; the checkpoint verifier reads it
            return
        sd = get_peft_model_state_dict(self.shared.peft, adapter_name=self.adapter)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in sd.items()}, path / ADAPTER_WEIGHTS, metadata={"format": "pt"}
        )
        cfg = self.shared.peft.peft_config[self.adapter]
        cfg.base_model_name_or_path = self.shared.path
        cfg.save_pretrained(str(path))


def _owns(param: str, adapter: str) -> bool:
    """Whether peft parameter ``param`` belongs to ``adapter`` (``...q_proj.lora_A.solver.weight``)."""
    return re.search(rf"\.lora_[A-Za-z_]+\.{re.escape(adapter)}(\.|$)", param) is not None


def _forward_params(model) -> set[str]:
    import inspect

    return set(inspect.signature(type(model).forward).parameters)


def build_slots(wf: Workflow, config, device: str, resume_from: Path | None, dist) -> list[PolicySlot]:
    """The trainer's slots for a workflow with adapters (full policies are loaded as usual);
    their backends are attached by the rollout stage (``rollout/backends.py``).

    Args:
        wf, config, device, resume_from, dist: as ``build.build_policies`` gets them.
    Raises:
        ConfigError: ``strategy = "fsdp"`` (adapters are replicated, not sharded).
    """
    from transformers import AutoModelForCausalLM

    from srpo_graph.models import resolve_model
    from srpo_graph.models.tiny import load_tokenizer

    check_strategy(wf, config, dist.world_size)
    dtype = getattr(torch, config.rollout.dtype)
    kl = float(getattr(config.loss, "kl_coef", 0.0) or 0.0)
    by_name = wf.policy_by_name
    bases: dict[str, SharedBase] = {}
    for base_name in sorted(wf.frozen_bases, key=[p.name for p in wf.policies].index):
        adapters = [p for p in wf.policies if p.adapter is not None and p.adapter.base == base_name]
        bases[base_name] = SharedBase(
            resolve_model(by_name[base_name].model), adapters, dtype=dtype, device=device, resume_from=resume_from
        )
    slots: list[PolicySlot] = []
    for pol in wf.policies:
        if pol.name in wf.untrained_policies and pol.name not in wf.frozen_bases:
            continue  # declared frozen or external: train/policies/frozen.py
        shared = bases.get(pol.adapter.base if pol.adapter is not None else pol.name)
        model: Any
        ref: Any
        if shared is not None:
            model = AdapterModel(shared, pol.name if pol.adapter is not None else None)
            base, tok = shared.path, load_tokenizer(shared.path)
            ref = AdapterModel(shared, None) if kl != 0.0 else None  # the reference is the base itself: free
            params = list(model.parameters())
        else:
            base = resolve_model(pol.model)
            path = str(ckpt.policy_path(resume_from, pol.name)) if resume_from else base
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            model = model.to(device).eval()
            tok = load_tokenizer(path)
            ref = None
            if kl != 0.0:
                ref = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
                ref = ref.to(device).eval()
                ref.requires_grad_(False)
            params = list(model.parameters())
        # a frozen base has no trainable parameter: its AdamW never holds state (no grads)
        opt, sched = make_optimizer(params, config)
        slots.append(
            PolicySlot(
                name=pol.name,
                base=base,
                model=model,
                tokenizer=tok,
                optimizer=opt,
                scheduler=sched,
                backend=None,
                ref_model=ref,
            )
        )
    return slots


# --------------------------------------------------------------------------- export


def export_adapter(source: str | Path, policy: str, out: str | Path, *, dtype: str = "float32") -> Path:
    """Merge adapter ``policy`` of a run (or of one checkpoint) into its base and save a full model.

    Args:
        source: a run folder (its newest good checkpoint is used) or a ``checkpoints/step_N`` folder.
        policy: the adapter policy's name.
        out: the folder to write (``save_pretrained`` model + tokenizer); must not exist or be empty.
        dtype: the dtype the merged model is saved in.
    Returns:
        ``out``.
    Raises:
        ConfigError: no checkpoint, no such policy, not an adapter, ``out`` not empty.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from srpo_graph.models.tiny import load_tokenizer

    hf_logging.disable_progress_bar()
    source, out = Path(source), Path(out)
    checkpoint = ckpt.open_checkpoint(source, reader="export")  # Note [One verified read]
    folder = ckpt.policy_path(checkpoint, policy)
    if not folder.is_dir():
        have = sorted(p.name for p in (checkpoint / "policies").iterdir()) if (checkpoint / "policies").is_dir() else []
        raise ConfigError.at(str(ckpt.layout.origin(checkpoint)), f"no policy {policy!r} (has {have})")
    if (folder / FROZEN_MARKER).is_file():
        model = json.loads((folder / FROZEN_MARKER).read_text())["model"]
        raise ConfigError.at(
            str(folder),
            f"policy {policy!r} is a frozen base, it was not trained",
            fix=f"its model is {model} as it was; export one of its adapters instead",
        )
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ConfigError.at(
            str(folder),
            f"policy {policy!r} is not a LoRA adapter",
            fix="a full policy's folder already is a complete model (load it with from_pretrained)",
        )
    if out.exists() and any(out.iterdir()):
        raise ConfigError.at(str(out), "the folder is not empty", fix="choose a new folder")
    base_path = json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        merged = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    tmp = out.with_name(out.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    load_tokenizer(str(folder)).save_pretrained(tmp)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out
