"""The VS Code extension's TextMate grammar agrees with the parser on every shipped example.

The grammar (``editors/vscode/syntaxes/wf.tmLanguage.json``) is run as VS Code runs it
(vscode-textmate with Oniguruma, ``editors/vscode/test/tokens.js``); the oracle is the Lark
grammar itself: every token the parser reads gets the scope of its class (a comment, a string,
a number, a keyword, a type, a declared name, a plain name never shown as a keyword), and every
``{reference}`` hole of a prompt is a template expression. Skipped where node or the
extension's npm packages are missing (``cd editors/vscode && npm ci``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from lark import Lark, Token

from srpo_graph.lang import ast
from srpo_graph.lang.parser import grammar_text, parse

ROOT = Path(__file__).resolve().parents[2]
EXT = ROOT / "editors/vscode"
EXAMPLES = sorted((ROOT / "workflows").rglob("*.wf")) + sorted((ROOT / "tests/lang/golden/ok").glob("*.wf"))



def _node_modules() -> Path:
    """Where the extension's npm packages are: a node_modules/ next to it (``npm ci`` by hand), else
    ``editors/vscode/ci.sh``'s build folder (it never writes into the checkout)."""
    import os

    build = Path(os.environ.get("SRPO_GRAPH_VSCODE_BUILD")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "srpo-graph" / "vscode-ext")
    here = EXT / "node_modules"
    return here if (here / "vscode-textmate").is_dir() else build / "node_modules"


NODE_MODULES = _node_modules()
NODE_ENV = {**__import__("os").environ, "NODE_PATH": str(NODE_MODULES)}
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "vscode-textmate").is_dir(),
    reason="node or the extension's npm packages are missing (bash editors/vscode/ci.sh installs them)")

TYPES = {"text", "int", "float", "bool", "choice", "choices", "list"}
CONSTANTS = {"end", "true", "false"}


def _tokens(files: list[Path]) -> dict[str, list]:
    out = subprocess.run(["node", str(EXT / "test/tokens.js"), *map(str, files)], capture_output=True, text=True,
                         timeout=120, check=True, env=NODE_ENV)
    return {d["file"]: d["lines"] for d in json.loads(out.stdout)}


@pytest.fixture(scope="module")
def highlighted() -> dict[str, list]:
    return _tokens(EXAMPLES)


def _lark_tokens(text: str) -> list[Token]:
    comments: list[Token] = []
    parser = Lark(grammar_text(), parser="lalr", lexer="contextual", propagate_positions=True,
                  maybe_placeholders=True, keep_all_tokens=True, lexer_callbacks={"COMMENT": comments.append})
    tree = parser.parse(text)
    return sorted([*tree.scan_values(lambda v: isinstance(v, Token)), *comments], key=lambda t: t.start_pos or 0)


def _scope_at(lines: list, line: int, col: int, text_lines: list[str]) -> list[str]:
    """The scopes of the character at 1-based (line, column); TextMate indexes count UTF-16 units."""
    unit = len(text_lines[line - 1][: col - 1].encode("utf-16-le")) // 2
    for start, end, scopes in lines[line - 1]:
        if start <= unit < end:
            return scopes
    return ["source.wf"]


def _expected_class(tok: Token, previous: Token | None) -> str | None:
    kind, value = tok.type, str(tok.value)
    if kind == "COMMENT":
        return "comment."
    if kind in ("STRING", "LONG_STRING"):
        return "string."
    if kind in ("SIGNED_NUMBER", "INT"):
        return "constant.numeric"
    if kind == "CASE_LABEL":
        return "constant.other.label"
    if kind == "NAME":
        if previous is not None and str(previous.value) in ("agent", "transition", "policy", "workflow") \
                and previous.type != "NAME":
            return "entity.name"
        return "!keyword"
    if value.isidentifier():  # a keyword of the grammar
        if value in CONSTANTS:
            return "constant.language"
        if value in TYPES:
            return "support.type"
        return "keyword|storage|support.function"
    return None  # punctuation: any scope


@pytest.mark.proc
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_token_of_a_shipped_example_has_its_class(highlighted, path):
    text = path.read_text(encoding="utf-8")
    lines = highlighted[str(path)]
    text_lines = text.split("\n")
    wrong = []
    previous = None
    for tok in _lark_tokens(text):
        want = _expected_class(tok, previous)
        previous = tok if tok.type != "COMMENT" else previous
        if want is None:
            continue
        scopes = _scope_at(lines, tok.line, tok.column, text_lines)
        inner = scopes[-1]
        if want == "!keyword":
            ok = not inner.startswith(("keyword", "storage", "comment", "string", "constant.language", "support.type"))
        else:
            ok = any(inner.startswith(w) for w in want.split("|")) or (
                want in ("string.", "comment.") and any(s.startswith(want) for s in scopes))
        if not ok:
            wrong.append(
                f"{path.name}:{tok.line}:{tok.column} {tok.type} {str(tok.value)[:20]!r}: {scopes} (want {want})"
            )
    assert not wrong, "\n".join(wrong[:20])


@pytest.mark.proc
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_prompt_holes_are_template_expressions(highlighted, path):
    text = path.read_text(encoding="utf-8")
    lines = highlighted[str(path)]
    text_lines = text.split("\n")
    holes = [
        p
        for it in parse(text, str(path)).items
        if isinstance(it, ast.AgentDecl)
        for i in it.items
        if isinstance(i, ast.PromptItem)
        for p in i.template.parts
        if isinstance(p, ast.Ref)
    ]
    for ref in holes:
        for line, col in ((ref.span.line, ref.span.col), (ref.span.end_line, ref.span.end_col - 1)):
            scopes = _scope_at(lines, line, col, text_lines)
            assert "meta.template.expression.wf" in scopes and "string.quoted" in " ".join(scopes), (ref, scopes)
        after = _scope_at(lines, ref.span.end_line, ref.span.end_col, text_lines)
        # the hole ends at its '}' (what follows is text, or the next hole's '{')
        assert "meta.template.expression.wf" not in after or after[-1].endswith("template-expression.begin.wf")


@pytest.mark.proc
def test_the_assertion_tests_of_the_grammar_pass():
    """``npm run test:grammar``: vscode-tmgrammar-test on editors/vscode/test/*.wf (scopes
    asserted by hand, character by character)."""
    run = subprocess.run(
        [
            "node",
            str(NODE_MODULES / "vscode-tmgrammar-test/dist/unit.js"),
            "-g",
            "syntaxes/wf.tmLanguage.json",
            "test/*.wf",
        ],
        cwd=EXT,
        capture_output=True,
        text=True,
        timeout=120,
        env=NODE_ENV,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_ci_sh_writes_nothing_into_the_checkout_but_the_package(tmp_path):
    """Issue 39, item 7: ``ci.sh`` ran ``npm ci`` inside the checkout, which fails on a read-only one.
    It builds in its build folder (the packages already there are reused) and copies the .vsix back."""
    if NODE_MODULES.parent == EXT:
        pytest.skip("the npm packages are in the checkout (npm ci by hand): ci.sh's build folder is not set up")
    checkout = tmp_path / "vscode"
    shutil.copytree(EXT, checkout, ignore=shutil.ignore_patterns("node_modules", "*.vsix"))
    before = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    run = subprocess.run(["bash", str(checkout / "ci.sh")], capture_output=True, text=True, timeout=600,
                         env={**NODE_ENV, "SRPO_GRAPH_VSCODE_BUILD": str(NODE_MODULES.parent)})
    assert run.returncode == 0, run.stdout + run.stderr
    after = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    assert [p for p in after if p not in before] == [Path("srpo-graph-wf.vsix")]

