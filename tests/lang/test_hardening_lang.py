"""The checker never hangs or crashes on hostile input, and the formatter never changes meaning
(issue 12, items 10-17). The golden files in ``golden/bad`` hold each error's exact text; these
tests cover what golden files cannot: time bounds, exit codes and round trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srpo_graph.errors import Diagnostic, Span, WorkflowSyntaxError, render_diagnostic, source_lines
from srpo_graph.lang import check, format_source, parse

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

HEAD = 'workflow w\nimport std\npolicy p = "tiny"\n'


def _pathological() -> dict[str, str]:
    """Graphs built to stress every analysis: duplicate names in cycles, long chains, wide joins."""
    n = 150
    chain = "".join(
        f'agent a{i} {{ policy: p prompt: "{{a{i - 1}}}" }}\n' if i else 'agent a0 { policy: p prompt: "x" }\n'
        for i in range(n)
    )
    chain += "".join(
        f"transition t{i} {{ consume: a{i} activate: {f'a{i + 1}' if i + 1 < n else 'end'} }}\n" for i in range(n)
    )
    dup = "".join(f'agent a{i} {{ policy: p prompt: "{{a{(i + 1) % 8}}}" }}\n' for i in range(8))
    dup += "".join(f"transition t {{ consume: a{i} activate: a{(i + 1) % 8}, a{(i + 3) % 8} }}\n" for i in range(8))
    wide = "".join(f'agent w{i} {{ policy: p prompt: "x" }}\n' for i in range(60))
    wide += f"transition j {{ consume: {', '.join(f'w{i}' for i in range(60))} activate: end }}\n"
    return {
        "chain.wf": HEAD + chain + "start: a0\n",
        "dup_cycles.wf": HEAD + dup + "start: a0\n",
        "wide.wf": HEAD + wide + f"start: {', '.join(f'w{i}' for i in range(60))}\n",
    }


@pytest.mark.proc
def test_every_analysis_ends_on_every_file(tmp_path):
    """`check` on every golden file, example and pathological graph, in one process under a
    timeout: a hang (two transitions of one name looped forever) fails here instead of hanging CI."""
    for name, text in _pathological().items():
        (tmp_path / name).write_text(text)
    files = sorted(GOLDEN.glob("*/*.wf")) + sorted((ROOT / "workflows").glob("*.wf")) + sorted(tmp_path.glob("*.wf"))
    code = textwrap.dedent("""
        import json, sys
        from srpo_graph.errors import SrpoGraphError
        from srpo_graph.lang import load_workflow
        out = {}
        for f in sys.argv[1:]:
            try:
                load_workflow(f)
                out[f] = "ok"
            except SrpoGraphError as exc:
                out[f] = type(exc).__name__
        print(json.dumps(out))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, env=ENV, timeout=180
    )  # guards against a hang; asserts nothing about speed
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert len(result) == len(files)
    assert all(v == "ok" for f, v in result.items() if "/golden/ok/" in f or "/workflows/" in f)
    assert all(v in ("WorkflowSyntaxError", "WorkflowCheckError") for f, v in result.items() if "/golden/bad/" in f)
    assert result[str(tmp_path / "dup_cycles.wf")] == "WorkflowCheckError"
    assert result[str(tmp_path / "chain.wf")] == result[str(tmp_path / "wide.wf")] == "ok"


@pytest.mark.proc
@pytest.mark.parametrize("module", ["exits_at_import", "interrupts_at_import"])
def test_a_module_that_exits_at_import_cannot_end_or_fool_check(module):
    wf = GOLDEN / "bad" / ("import_system_exit.wf" if module == "exits_at_import" else "import_keyboard_interrupt.wf")
    proc = subprocess.run(["srpo-graph", "check", str(wf)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"cannot import module '{module}'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("depth", [33, 500, 50_000])
def test_any_nesting_depth_is_a_located_error(depth):
    text = HEAD + 'agent a { policy: p prompt: "x" output: ' + "{f: " * depth + "int" + "}" * depth + " }\nstart: a\n"
    with pytest.raises(WorkflowSyntaxError) as info:
        parse(text, "deep.wf")
    d = info.value.diagnostics[0]
    assert d.code == "too-deep" and d.span.line == 4 and d.span.col == 41 + 4 * 32


def test_32_levels_are_fine():
    text = (
        HEAD + 'agent a { policy: p prompt: "x" output: ' + "list[" * 32 + "int" + "]" * 32 + " via std.json_record }"
    )
    parse(text + "\nstart: a\n")


@pytest.mark.parametrize("sep", ["\r\n", "\r", "\n"])
def test_line_ends_are_counted_the_same_by_parser_and_printer(sep):
    lines = [
        "workflow w",
        "import std",
        'policy p = "tiny"',
        'agent a { policy: p prompt: "x\u2028y\fz\vw" }',
        "transition t { consume: a activate: nobody }",
        "start: a",
    ]
    text = sep.join(lines) + sep
    from srpo_graph.errors import WorkflowCheckError

    with pytest.raises(WorkflowCheckError) as info:
        check(parse(text, "f.wf"), text)
    rendered = str(info.value)
    assert "f.wf:5:37: error: transition 't' activates unknown agent 'nobody'" in rendered
    assert "  5 | transition t { consume: a activate: nobody }" in rendered


def test_the_printer_shows_invisible_characters_visibly_and_keeps_the_caret():
    src = 'x = "a\u2028b\fc"  bad'
    d = Diagnostic(
        "here", Span(path="f.wf", line=1, col=src.index("bad") + 1, end_line=1, end_col=src.index("bad") + 4)
    )
    _, line, caret = render_diagnostic(d, src).splitlines()
    assert "\u2028" not in line and "\f" not in line
    assert line.index("bad") == caret.index("^")
    assert source_lines("a\u2028b\x85c\fd") == ["a\u2028b\x85c\fd"]


def _semantics(text: str) -> dict:
    """The checked workflow without spans and source hash (what running it depends on)."""

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("span", "source_hash", "path")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(check(parse(text, "f.wf"), text).model_dump(mode="json"))


TRICKY = HEAD + textwrap.dedent('''\
    agent a {
      policy: p
      prompt: """multi
    line\\ttab \\"q\\" \\{brace\\}"""
      sample { temperature: 99.99999999999999, top_p: 5e-324, top_k: 0007, max_tokens: +64, stop: ["\\n", "é"] }
      output: int via std.digit
    }
    agent b {
      policy: p
      prompt: "{a}"
      sample { temperature: 1e-300, top_p: 1.0e0, max_tokens: 999999 }
    }
    transition t { consume: a activate: b }
    transition u { consume: b reward: std.numeric_match(b, "x", tol=1e22) activate: end max_rounds: 000001 }
    start: a
    max_steps: 1000000
    ''')


@pytest.mark.parametrize(
    "name",
    ["tricky"]
    + sorted(p.name for p in (ROOT / "workflows").glob("*.wf"))
    + sorted(f"golden/{p.name}" for p in (GOLDEN / "ok").glob("*.wf")),
)
def test_fmt_never_changes_what_a_valid_file_means(name, monkeypatch):
    if name == "tricky":
        text = TRICKY
    elif name.startswith("golden/"):
        monkeypatch.chdir(GOLDEN / "ok")  # its helper modules import from there
        text = (GOLDEN / "ok" / name.split("/", 1)[1]).read_text(encoding="utf-8")
    else:
        monkeypatch.chdir(ROOT / "workflows")  # its helper modules (chat_tools, searchpool) import from there
        text = (ROOT / "workflows" / name).read_text(encoding="utf-8")
    before = _semantics(text)
    formatted = format_source(text, "f.wf")
    assert _semantics(formatted) == before
    assert format_source(formatted, "f.wf") == formatted


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1e-999", "123456789012345678901"])
def test_numbers_that_cannot_be_kept_exactly_are_errors_not_rewrites(number):
    text = HEAD + f'agent a {{ policy: p prompt: "x" sample {{ temperature: {number} }} }}\nstart: a\n'
    with pytest.raises(WorkflowSyntaxError) as info:
        format_source(text, "f.wf")
    assert info.value.diagnostics[0].code == "bad-number" and info.value.diagnostics[0].span.line == 4
