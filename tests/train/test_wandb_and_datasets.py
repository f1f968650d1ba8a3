"""A real run logged to Weights & Biases in its offline mode (``WANDB_MODE=offline``) on tasks read
from a Parquet file through Hugging Face ``datasets``: the W&B run's summary holds the last step's
metrics as ``metrics.jsonl`` has them, and W&B is off unless asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb")
datasets = pytest.importorskip("datasets")

from srpo_graph.train.config.loading import validate  # noqa: E402
from srpo_graph.train.observe.metrics import read_metrics  # noqa: E402
from srpo_graph.train.trainer import train  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, tasks: Path, run: str, **logging):
    return validate({"steps": 2, "seed": 0, "run_dir": str(tmp_path / run),
                     "rollout": {"tasks": str(tasks), "tasks_per_step": 4, "samples": 2},
                     "eval": {"every": 0}, "checkpoint": {"every": 0},
                     "logging": {"progress": False, "tensorboard": False, "plots": False, **logging}})


@pytest.mark.slow
def test_offline_wandb_run_on_parquet_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tasks = tmp_path / "routed.parquet"
    datasets.Dataset.from_list(
        [{"id": f"t{i}", "target": i % 10, "route": "abc"[i % 3]} for i in range(12)]
    ).to_parquet(str(tasks))
    run = Path(
        train(
            ROOT / "workflows" / "coord_routed.wf",
            _config(tmp_path, tasks, "run", wandb=True, wandb_project="srpo-test"),
        ).run_dir
    )
    rows = read_metrics(run / "metrics.jsonl")
    run_id = (run / "wandb_id.txt").read_text().strip()
    files = sorted((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert files
    # wandb's core process may still be flushing the file when finish() returns: wait while it grows
    wait_for(lambda: len(_history(files[-1])) >= len(rows), progress=lambda: files[-1].stat().st_size, stall=120,
             what=f"{len(rows)} steps in {files[-1]}", interval=0.5)
    history = _history(files[-1])
    assert [h["_step"] for h in history] == [r["step"] for r in rows] == [1, 2]
    for h, r in zip(history, rows):
        numbers = {
            k: v for k, v in r.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        assert {"reward", "reward/dispatch", "loss", "grad_norm/tiny"} <= numbers.keys()
        for key, value in numbers.items():
            assert h[key] == pytest.approx(value, rel=1e-12, abs=0), key


def _history(path: Path) -> list[dict]:
    """The history rows of an offline W&B run file, read independently of wandb's own reader: the
    file is a LevelDB-style log (7-byte file header, 32 KiB blocks, records with a 7-byte header
    crc32/length/type, FULL=1 FIRST=2 MIDDLE=3 LAST=4) of ``wandb_internal_pb2.Record``s."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, records, cur = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # still being written
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        cur = chunk if kind in (1, 2) else cur + chunk
        if kind in (1, 4):
            records.append(cur)
    rows = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_is_off_by_default(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"target": i, "route": "abc"[i % 3]}) + "\n" for i in range(8)))
    cfg = _config(tmp_path, tasks, "run")
    assert cfg.logging.wandb is False
    cfg = cfg.model_copy(update={"steps": 1})
    run = Path(train(ROOT / "workflows" / "coord_routed.wf", cfg).run_dir)
    assert not (run / "wandb").exists() and not (run / "wandb_id.txt").exists()
