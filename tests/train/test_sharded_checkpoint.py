"""Sharded (DCP) checkpoints (srpo_graph/train/checkpoint/sharded.py) in one process: the same code
every FSDP rank runs (dcp.save / dcp.load of model and Adam state), checked here without a group
(the 2-process save/resume is tests/train/test_train_fsdp.py): a round trip restores weights and
Adam state exactly; the verifier accepts the layout and names a damaged shard or a NaN weight;
`consolidate` writes a folder `from_pretrained` loads as the same weights."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
from srpo_graph.train import checkpoint as ckpt
from srpo_graph.train.checkpoint import sharded as sc

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


@pytest.fixture(scope="module")
def tiny():
    return str(ensure_tiny_model())


def _trained(path, seed=0):
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0 / (n + 1))
    ids = torch.randint(0, 20, (2, 6))
    for _ in range(2):
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return m, opt, sched


def _save(run, m, opt, sched, path, step=3):
    return sc.save(run, ckpt.LoopState(step=step, cursor=5), models={"p": m}, tokenizers={"p": load_tokenizer(path)},
                   optimizers={"p": opt}, schedulers={"p": sched})


def test_round_trip_verify_and_consolidate(tiny, tmp_path):
    m, opt, sched = _trained(tiny)
    ck = _save(tmp_path, m, opt, sched, tiny)
    assert sc.is_sharded_checkpoint(ck) and ckpt.verify_checkpoint(ck) is None
    assert not list(ckpt.policy_path(ck, "p").glob("*.safetensors"))  # weights only as shards
    # resume: a model built from the checkpoint's config, weights and Adam state from the shards
    m2 = sc.load_model(ckpt.policy_path(ck, "p"), torch.float32)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda n: 1.0 / (n + 1))
    sc.load_policy(ck, "p", m2, opt2)
    state = ckpt.load_checkpoint(ck, optimizers={"p": opt2}, schedulers={"p": sched2})
    assert (state.step, state.cursor) == (3, 5) and sched2.state_dict() == sched.state_dict()
    for (n, a), b in zip(m.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), n
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[a][k], opt2.state[b][k]), (n, k)
    # consolidate, in files of at most 64 KiB: the same weights through from_pretrained
    out = sc.consolidate(ck, "p", tmp_path / "out", shard_bytes=64 << 10)
    assert (out / "model.safetensors.index.json").is_file() and (out / "tokenizer.json").is_file()
    m3 = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    sd, sd3 = m.state_dict(), m3.state_dict()
    assert sd.keys() == sd3.keys()
    for k in sd:
        assert torch.equal(sd[k], sd3[k]), k
    with pytest.raises(Exception, match="no policy 'q'"):
        sc.consolidate(ck, "q", tmp_path / "none")


def test_the_verifier_names_a_damaged_shard_and_a_nan_weight(tiny, tmp_path):
    m, opt, sched = _trained(tiny)
    ck = _save(tmp_path / "a", m, opt, sched, tiny)
    shard = next((ck / "dcp" / "p").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "does not match its checksum" in ckpt.verify_checkpoint(ck)
    # a NaN that got into the shards (written behind save's own check): found by reading them back
    ck2 = _save(tmp_path / "b", m, opt, sched, tiny)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with torch.no_grad():
        next(m.parameters()).view(-1)[0] = float("nan")
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ck2 / "dcp" / "p"))
    from srpo_graph.train.checkpoint.layout import manifest

    marker = json.loads((ck2 / ckpt.COMPLETE).read_text())
    marker["files"] = manifest(ck2)  # a manifest that matches the NaN shards: the finiteness check finds them
    (ck2 / ckpt.COMPLETE).write_text(json.dumps(marker))
    assert "is not finite" in ckpt.verify_checkpoint(ck2)
    marker.pop("files")  # no manifest: the .metadata pickle is never read unverified (Note [DCP metadata])
    (ck2 / ckpt.COMPLETE).write_text(json.dumps(marker))
    assert "has no manifest" in ckpt.verify_checkpoint(ck2)
    with pytest.raises(ValueError, match="not finite"):  # save itself refuses a NaN model
        _save(tmp_path / "c", m, opt, sched, tiny)


def test_consolidate_names_a_folder_that_is_no_run(tmp_path):
    """A user error: the command names the folder and what it expected, exit code 7, no traceback."""
    from tests.support.cli import invoke

    proc = invoke("consolidate", tmp_path, "--out", tmp_path / "out")
    assert proc.exit_code == 7 and "not a run folder" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
