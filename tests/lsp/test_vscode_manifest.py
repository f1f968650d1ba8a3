"""The VS Code extension's manifest and its docs agree (no node needed)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_name_every_setting_and_command_the_extension_contributes():
    """Issue 39, item 7: docs/editor.md omitted ``srpoGraph.tokens`` and the restart command."""
    contributes = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text())["contributes"]
    names = [*contributes["configuration"]["properties"], *(c["command"] for c in contributes["commands"])]
    doc = (ROOT / "docs" / "editor.md").read_text()
    assert [n for n in names if f"`{n}`" not in doc] == []
