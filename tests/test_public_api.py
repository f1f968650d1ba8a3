"""The public API runs the pipeline with its own names only (issue 10, item 6): the Python
section of docs/tutorial.md is executed as written (with a shorter training run)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import torch

import srpo_graph

ROOT = Path(__file__).resolve().parents[1]


def test_every_exported_name_resolves():
    for name in srpo_graph.__all__:
        assert getattr(srpo_graph, name) is not None, name


def test_the_tutorial_pipeline_runs_on_public_names_only(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    code = re.search(r"## 6\. The same in Python\n\n```python\n(.*?)```", text, re.S).group(1)
    imports = re.findall(r"^(?:from|import) .*$", code, re.M)
    assert imports == ["import srpo_graph as sg"], imports  # nothing internal is needed
    code = code.replace("sg.TrainConfig(steps=50)", f"sg.TrainConfig(steps=2, run_dir={str(tmp_path / 'run')!r})")
    monkeypatch.chdir(ROOT)
    script = tmp_path / "tutorial_section6.py"
    script.write_text(code, encoding="utf-8")
    scope = runpy.run_path(str(script))
    assert scope["batch"].num_sets > 0 and torch.isfinite(scope["loss"])
    grads = [p.grad for p in scope["backend"].model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    assert scope["summary"].steps == 2
    assert (tmp_path / "run" / "metrics.jsonl").exists()
