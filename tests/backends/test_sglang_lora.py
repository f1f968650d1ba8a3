"""SGLang for LoRA adapter policies (issue 13): one server per shared base, per-request
``lora_path``, an adapter reloaded under a new name after each update.

The client's protocol is checked against recorded calls (always); the real CPU server
(SGLang 0.5.23 with ``--enable-lora --lora-backend torch_native`` and the pin-memory shim) trains
and resumes a workflow of two adapters (opt-in outside CI, required in CI: sglang_servers.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from srpo_graph.backends.base import GenerationRequest  # noqa: E402
from srpo_graph.backends.ports import claim_ports  # noqa: E402
from srpo_graph.backends.sglang_lora import SGLangAdapterBackend, lora_flags  # noqa: E402
from tests.support.sglang_servers import require_sglang  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _Saved:
    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x")


def _backend(tmp_path, adapter):
    b = SGLangAdapterBackend("http://127.0.0.1:9", None, adapter=adapter, check_health=False,
                             weight_dir=tmp_path / "w", vocab_size=73)
    calls = []
    b._post = lambda base, route, body, **kw: calls.append((route, dict(body))) or {"success": True}
    return b, calls


def test_requests_name_the_current_adapter_and_updates_swap_it(tmp_path):
    b, calls = _backend(tmp_path, "solver")
    req = GenerationRequest(prompt_ids=(1, 2), max_new_tokens=1, request_id="r")
    with pytest.raises(Exception, match="never loaded"):
        b.payload(req)
    b.sync_weights(_Saved(), 0)
    assert b.payload(req)["lora_path"] == "solver@v0"
    b.sync_weights(_Saved(), 3)
    assert b.payload(req)["lora_path"] == "solver@v3" and b.weight_version == 3
    assert [(r, c["lora_name"]) for r, c in calls] == [
        ("/load_lora_adapter", "solver@v0"), ("/load_lora_adapter", "solver@v3"), ("/unload_lora_adapter", "solver@v0")]
    assert calls[1][1]["lora_path"] == str(tmp_path / "w" / "v3")
    assert not (tmp_path / "w" / "v0").exists() and (tmp_path / "w" / "v3").is_dir()  # the old one removed
    assert b._version_of({"weight_version": "default"}) == 3  # the server's base never changes version


def test_the_frozen_base_names_no_adapter_and_never_reloads(tmp_path):
    b, calls = _backend(tmp_path, None)
    b.sync_weights(object(), 5)
    req = GenerationRequest(prompt_ids=(1, 2), max_new_tokens=1, request_id="r")
    assert "lora_path" not in b.payload(req) and calls == [] and b.weight_version == 5


def test_server_flags_cover_every_adapter_of_the_base():
    class M:
        def __init__(self, name, r, targets):
            self.lora_name, self.lora_rank, self.lora_targets = name, r, targets

    flags = lora_flags([M("a", 8, ("q_proj", "v_proj")), M("b", 16, ("o_proj",))], cpu=True)
    assert flags[flags.index("--max-lora-rank") + 1] == "16"
    assert flags[-2:] == ["--lora-backend", "torch_native"] and "o_proj" in flags


@pytest.mark.sglang
def test_adapters_train_and_resume_on_one_real_cpu_server(tmp_path):
    """Two adapters of coord_lora2 on ONE launched server; every update reloads both; resume."""
    import torch

    from srpo_graph.backends.sglang_server import live_servers
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.trainer import train

    require_sglang()
    torch.set_num_threads(1)
    run = tmp_path / "run"

    def config(*extra):
        return load_config(None, ["steps=4", f"run_dir={json.dumps(str(run))}", "rollout.backend=sglang",
                                  "rollout.sglang.launch=cpu", f"rollout.sglang.port={claim_ports(1)[0]}",
                                  "rollout.tasks_per_step=4", "rollout.samples=4", "checkpoint.every=2",
                                  "eval.every=0", "logging.tensorboard=false", "logging.progress=false",
                                  "logging.plots=false", *extra])

    before = {id(s) for s in live_servers()}
    train(ROOT / "workflows" / "coord_lora2.wf", config("debug.stop_after_step=2"))
    assert sorted(p.name for p in (run / "sglang").glob("*.log")) == ["base.log"]  # one server for both adapters
    summary = train(ROOT / "workflows" / "coord_lora2.wf", config(), resume=True)
    assert summary.steps == 4 and summary.steps_this_run == 2
    assert {id(s) for s in live_servers()} <= before  # the servers it launched are gone
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/backend_failures"] == 0 and r["rollout/stale_outputs"] == 0 for r in rows)
    # the server's adapter (bf16) samples what the trainer's adapter (fp32) scores
    assert all(r["mismatch/a/mean_abs"] < 0.02 and r["mismatch/b/mean_abs"] < 0.02 and r["mismatch/a/max_abs"] < 0.2
               and r["mismatch/b/max_abs"] < 0.2 for r in rows), rows  # bf16 vs fp32 (test_sglang_train.py)
    # a step whose groups all have one reward has zero advantages (grad 0): the server's sampling is not
    # seeded on CPU, so require a gradient for each adapter in some step (all four at 0: p ~ 1e-3)
    assert all(math.isfinite(r["grad_norm/role_a"]) and math.isfinite(r["grad_norm/role_b"]) for r in rows)
    assert any(r["grad_norm/role_a"] > 0 for r in rows) and any(r["grad_norm/role_b"] > 0 for r in rows), rows
    log = (run / "sglang" / "base.log").read_text(errors="replace")
    assert log.count("/load_lora_adapter") >= 2 * 2 and "/unload_lora_adapter" in log
    versions = {o["policy_version"] for line in (run / "traces" / "step_4.jsonl").read_text().splitlines()
                for o in json.loads(line)["outputs"]}
    assert versions == {3}


def test_adapters_refuse_a_process_group_sync_before_any_server_starts(tmp_path):
    """`rollout.sglang.sync=distributed` with adapters: a config error naming the field and why (SGLang
    0.5.23 streams base weights only), before anything is launched; `auto` keeps disk for them."""
    from srpo_graph.backends.options import SGLangOptions
    from srpo_graph.backends.sglang_fleet import serve_adapters
    from srpo_graph.errors import ConfigError

    with pytest.raises(ConfigError, match=r"field `rollout.sglang.sync`") as info:
        serve_adapters([], SGLangOptions(sync="distributed", launch="cpu"), tmp_path)
    assert "base-model weights only" in str(info.value) and "sync = \"auto\"" in str(info.value)
    assert not (tmp_path / "sglang").exists()  # nothing launched
    assert serve_adapters([], SGLangOptions(sync="auto"), tmp_path) == {}  # auto: no refusal
