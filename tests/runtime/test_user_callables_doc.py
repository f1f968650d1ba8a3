"""The "write your own reward, tool or extractor" section of docs/language.md, run as written: its
Python module is taken from the page, used by a workflow, and the documented outcomes hold on
real episodes of the tiny model (a ValueError leaves the value None, a route on a Literal tool,
a reward called with None, a failing call fails the episode naming its line)."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task

ROOT = Path(__file__).resolve().parents[2]

WF = '''workflow own
import std
import {mod} as my
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  sample {{ max_tokens: 2, allow: ["1", "2", " "] }}
  output: text via my.first_word
}}
agent n {{
  policy: tiny
  prompt: "<b>{{task.target}}"
  sample {{ max_tokens: 1, allow: ["0", "1", "2"] }}
  output: int via std.digit
}}
transition judge {{
  consume: a
  activate: n
}}
transition score {{
  consume: n
  tool verdict = my.verdict(n, task.target)
  reward: my.close_to(n, task.target)
  activate: route verdict {{ stop -> end, again -> end }}
}}
start: a
'''


def _module(tmp_path: Path) -> str:
    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    section = page[page.index("## Write your own reward, tool or extractor"):page.index("## Semantics")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    mod = f"my_checks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(code, encoding="utf-8")
    return mod


def test_the_documented_module_behaves_as_documented(tmp_path, tiny_backend):
    mod = _module(tmp_path)
    (tmp_path / "own.wf").write_text(WF.format(mod=mod), encoding="utf-8")
    wf = load_workflow(tmp_path / "own.wf")
    eps = run(wf, [Task(id=f"t{i}", fields={"target": i}) for i in range(3)], {"tiny": tiny_backend},
              samples=6, seed=0).episodes
    checks = sys.modules.get(mod)
    assert checks is not None
    for ep in eps:
        assert ep.status == "ok", ep.error
        a = next(o for o in ep.outputs if o.agent == "a")
        words = a.text.split()
        assert a.value == (words[0] if words else None)  # ValueError -> None, the episode goes on
        n = next(o for o in ep.outputs if o.agent == "n")
        target = int(ep.task_id[1:])
        score = ep.transitions[-1]
        assert score.tool_results == {"verdict": "stop" if n.value == target else "again"}
        assert score.reward == checks.close_to(n.value, target) == 1.0 / (1 + abs(n.value - target))


def test_a_failing_reward_fails_the_episode_naming_its_line(tmp_path, tiny_backend):
    mod = _module(tmp_path)
    (tmp_path / f"{mod}.py").write_text((tmp_path / f"{mod}.py").read_text() + "\n\ndef bad(x) -> float:\n"
                                        "    return float('yes')\n", encoding="utf-8")
    text = WF.format(mod=mod).replace("reward: my.close_to(n, task.target)", "reward: my.bad(n)")
    (tmp_path / "bad.wf").write_text(text, encoding="utf-8")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "my.bad" in s)
    wf = load_workflow(tmp_path / "bad.wf")
    eps = run(wf, [Task(id="t0", fields={"target": 1})], {"tiny": tiny_backend}, samples=2, seed=0).episodes
    assert all(ep.status == "failed" and ep.error.startswith(f"{wf.path}:{line}:") for ep in eps), [
        e.error for e in eps
    ]
