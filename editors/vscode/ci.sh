#!/usr/bin/env bash
# CI of the VS Code extension: install its npm packages (only when package-lock.json changed),
# run the grammar's assertion tests and package the .vsix. Idempotent and cheap (a few seconds
# once installed). Skips with a message, exit 0, where node/npm are missing or too old.
# tests/lsp/test_vscode_grammar.py (pytest) needs the packages this installs; run this first.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "editors/vscode: node/npm not found: skipping the grammar tests and packaging"
  exit 0
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "editors/vscode: node $(node --version) is older than 20 (@vscode/vsce 3.9 needs >= 20): skipping"
  exit 0
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run --silent test:grammar
npm run --silent package
