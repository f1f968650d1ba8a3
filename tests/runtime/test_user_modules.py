"""One importer for a workflow's own Python modules (issue 10, item 4): the checker and the
runtime import ``import my_tools`` from the ``.wf`` file's folder the same way, and neither
leaves that folder on ``sys.path``."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task

ROOT = Path(__file__).resolve().parents[2]


def test_a_tool_module_next_to_the_wf_is_found_and_sys_path_is_left_alone(tmp_path, tiny_backend):
    mod = f"my_tools_{uuid.uuid4().hex[:8]}"  # unique: never on sys.path or in sys.modules before
    (tmp_path / f"{mod}.py").write_text("def shout(a: int) -> str:\n    return f'digit {a}!'\n", encoding="utf-8")
    text = (ROOT / "workflows" / "coord_seq.wf").read_text(encoding="utf-8")
    text = text.replace("import std\n", f"import std\nimport {mod} as mine\n")
    text = text.replace("  consume: a\n  activate: b\n", "  consume: a\n  tool note = mine.shout(a)\n  activate: b\n")
    text = text.replace('prompt: "<b>{task.target}<sep>{a}"', 'prompt: "<b>{task.target}<sep>{a}{note}"')
    wf_path = tmp_path / "with_tool.wf"
    wf_path.write_text(text, encoding="utf-8")
    before = list(sys.path)
    wf = load_workflow(wf_path)  # the checker imports it (to check the function's signature)
    assert sys.path == before
    sys.modules.pop(mod, None)  # the runtime must find it again on its own
    eps = run(wf, [Task(id="t0", fields={"target": 9})], {"tiny": tiny_backend}, samples=2, seed=0).episodes
    assert sys.path == before
    assert all(ep.status == "ok" for ep in eps), [ep.error for ep in eps]
    b_prompts = [tiny_backend.tokenizer.decode(o.prompt_ids) for ep in eps for o in ep.outputs if o.agent == "b"]
    assert b_prompts and all("!" in p for p in b_prompts)


def test_a_failing_tool_or_reward_names_its_wf_line_like_a_check_error(tmp_path, tiny_backend):
    """Runtime failures of an episode carry the span of the `.wf` node that failed (issue 10, item 2)."""
    mod = f"bad_tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "def shout(a: int) -> str:\n    raise KeyError('no such doc')\n\n"
        "def score(target: int, a: int, b: int) -> float:\n    raise ZeroDivisionError('reward broke')\n",
        encoding="utf-8")
    text = (ROOT / "workflows" / "coord_seq.wf").read_text(encoding="utf-8")
    text = text.replace("import std\n", f"import std\nimport {mod} as mine\n")
    tool = "  tool note = mine.shout(a)\n"
    wf_tool = text.replace("  consume: a\n  activate: b\n", "  consume: a\n" + tool + "  activate: b\n")
    (tmp_path / "tool.wf").write_text(wf_tool, encoding="utf-8")
    line = wf_tool.splitlines().index(tool.rstrip("\n")) + 1
    wf = load_workflow(tmp_path / "tool.wf")
    eps = run(wf, [Task(id="t0", fields={"target": 9})], {"tiny": tiny_backend}, samples=2, seed=0).episodes
    for ep in eps:
        assert ep.status == "failed"
        assert ep.error.startswith(f"{wf.path}:{line}:3: error: tool 'note' raised KeyError('no such doc')"), ep.error

    wf_reward = text.replace("reward: std.digits_sum_to(task.target, a, b)", "reward: mine.score(task.target, a, b)")
    (tmp_path / "reward.wf").write_text(wf_reward, encoding="utf-8")
    line = next(i for i, s in enumerate(wf_reward.splitlines(), 1) if s.startswith("reward: mine.score"))
    wf = load_workflow(tmp_path / "reward.wf")
    eps = run(wf, [Task(id="t0", fields={"target": 9})], {"tiny": tiny_backend}, samples=2, seed=0).episodes
    assert {ep.status for ep in eps} == {"failed"}
    assert all(ep.error.startswith(f"{wf.path}:{line}:9: error: terminal reward mine.score: ZeroDivisionError")
               for ep in eps), eps[0].error
