"""Task files read through Hugging Face ``datasets`` (Parquet, ``save_to_disk`` folders): the same
tasks as the JSONL file holding the same rows, the same field checks, errors naming the row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from srpo_graph.errors import RuntimeFailure  # noqa: E402
from srpo_graph.lang import load_workflow  # noqa: E402
from srpo_graph.runtime.tasks import load_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"r{i}", "target": i, "route": "abc"[i % 3]} for i in range(6)]


@pytest.fixture(scope="module")
def wf():
    return load_workflow(ROOT / "workflows" / "coord_routed.wf")


def test_parquet_and_save_to_disk_give_the_jsonl_tasks(tmp_path, wf):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    expect = load_tasks(jsonl, wf)
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "t.parquet"))
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dd"))
    assert load_tasks(tmp_path / "t.parquet", wf) == expect
    assert load_tasks(tmp_path / "one", wf) == expect
    assert load_tasks(tmp_path / "dd", wf) == expect  # a DatasetDict: its train split
    assert load_tasks(f"{tmp_path / 'dd'}@test", wf) == expect[:2]
    with pytest.raises(RuntimeFailure, match=r"splits \['test', 'train'\]; no split 'dev'"):
        load_tasks(f"{tmp_path / 'dd'}@dev", wf)


def test_field_checks_name_the_row(tmp_path, wf):
    bad = [dict(r) for r in ROWS]
    bad[3]["target"] = "x"  # a string column: every target is a string now
    datasets.Dataset.from_list([{**r, "target": str(r["target"])} for r in bad]).to_parquet(str(tmp_path / "b.parquet"))
    with pytest.raises(RuntimeFailure, match=r"b\.parquet:row 1: error: field target: expected int, got str '0'"):
        load_tasks(tmp_path / "b.parquet", wf)
    datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "route"} for r in ROWS]).to_parquet(
        str(tmp_path / "m.parquet"))
    with pytest.raises(RuntimeFailure, match=r"m\.parquet:row 1: error: field route: missing"):
        load_tasks(tmp_path / "m.parquet", wf)
    dup = datasets.Dataset.from_list([ROWS[0], ROWS[1], ROWS[0]])
    dup.to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(RuntimeFailure, match=r"d\.parquet:row 3: error: field id: 'r0' already used on row 1"):
        load_tasks(tmp_path / "d.parquet", wf)
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(RuntimeFailure, match="cannot read task dataset"):
        load_tasks(tmp_path / "broken.parquet", wf)
