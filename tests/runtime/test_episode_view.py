"""An episode drawn on its routing graph: the used parts highlighted, the rest grey.

Episodes come from real runs (tiny model) of the shipped routed example; the SVG is parsed
as XML and each agent box / arc is checked against what the trace says happened.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.lang import load_workflow
from srpo_graph.runtime.episode_view import episode_svg
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.runtime.trace import read_traces

ROOT = Path(__file__).resolve().parents[2]
NS = {"s": "http://www.w3.org/2000/svg"}
OFF, UNUSED_BOX = "#d0d7de", "#f6f8fa"  # viz/render.py's greys for what the episode did not use


def _groups(root, prefix: str) -> dict[str, dict[str, str]]:
    """id -> the style of the first path of each renderer group ``prefix:...`` (agent:, transition:, arc:)."""
    out = {}
    for g in root.iter(f"{{{NS['s']}}}g"):
        gid = g.get("id") or ""
        path = g.find("s:path", NS)
        if gid.startswith(prefix) and path is not None:
            out[gid[len(prefix):]] = dict(kv.split(": ", 1) for kv in path.get("style", "").split("; ") if ": " in kv)
    return out


def _routed_episodes(tiny_backend):
    wf = load_workflow(ROOT / "workflows" / "coord_routed.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "routed.jsonl", wf)[:4]
    return wf, run(wf, tasks, {p.name: tiny_backend for p in wf.policies}, samples=3, seed=2).episodes


def test_the_chosen_specialist_and_its_arcs_are_highlighted(tiny_backend):
    wf, episodes = _routed_episodes(tiny_backend)
    chosen_seen = set()
    for ep in episodes:
        root = ET.fromstring(episode_svg(wf, ep))
        boxes = {name: style["fill"] for name, style in _groups(root, "agent:").items()}
        ran = {o.agent for o in ep.outputs}
        assert set(boxes) == {a.name for a in wf.agents}
        assert {a for a, fill in boxes.items() if fill != UNUSED_BOX} == ran
        route = next(t for t in ep.transitions if t.name == "dispatch")
        chosen_seen.update(route.activated)
        # one thick black arc per used (from, to) pair of the graph, the others grey
        arcs = _groups(root, "arc:")
        used = sum(1 for style in arcs.values() if style.get("stroke") == "#111111")
        grey = sum(1 for style in arcs.values() if style.get("stroke") == OFF)
        expected = 1 + 1 + len(route.activated)  # start->r, r->dispatch, dispatch->chosen
        expected += sum(len(t.consumed) + len(t.activated) for t in ep.transitions if t.name != "dispatch")
        assert used == expected and used + grey == wf.graph().number_of_edges()
    assert len(chosen_seen) >= 2  # the runs took different routes


def test_show_html_draws_the_episode_on_the_graph(tiny_backend, tmp_path):
    from srpo_graph.runtime.trace import write_traces

    wf, episodes = _routed_episodes(tiny_backend)
    traces = tmp_path / "t.jsonl"
    write_traces(traces, episodes)
    page = tmp_path / "e.html"
    res = CliRunner().invoke(app, ["show", str(traces), "--episode", "2", "--html", str(page),
                                   "--workflow", str(ROOT / "workflows" / "coord_routed.wf")])
    assert res.exit_code == 0, res.output
    text = page.read_text()
    assert text.count("<svg") == 1 and "dispatch" in text and "active set" in text
    assert episode_svg(wf, read_traces(traces)[2]) in text
    wrong = CliRunner().invoke(app, ["show", str(traces), "--html", str(page),
                                     "--workflow", str(ROOT / "workflows" / "coord_seq.wf")])
    assert wrong.exit_code != 0 and "coord_routed" in wrong.output
