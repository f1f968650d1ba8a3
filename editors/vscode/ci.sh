#!/usr/bin/env bash
# CI of the VS Code extension: install its npm packages (only when package-lock.json changed),
# run the grammar's assertion tests and package the .vsix. Idempotent and cheap (a few seconds
# once installed). Skips with a message, exit 0, where node/npm are missing or too old.
#
# Nothing is written into the checkout (it may be read-only): the extension's files are copied to a
# build folder, $SRPO_GRAPH_VSCODE_BUILD (default ~/.cache/srpo-graph/vscode-ext), where npm installs
# its packages and the .vsix is packaged; the .vsix is then copied next to this script when the
# checkout is writable. tests/lsp/test_vscode_grammar.py finds the packages there (or in a
# node_modules/ of this folder, where a developer ran `npm ci` by hand); run this first.
set -euo pipefail
src="$(cd "$(dirname "$0")" && pwd)"
build="${SRPO_GRAPH_VSCODE_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/srpo-graph/vscode-ext}"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "editors/vscode: node/npm not found: skipping the grammar tests and packaging"
  exit 0
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "editors/vscode: node $(node --version) is older than 20 (@vscode/vsce 3.9 needs >= 20): skipping"
  exit 0
fi
mkdir -p "$build"
build="$(cd "$build" && pwd)"
case "$build/" in
  "$src/"*) echo "editors/vscode: the build folder $build is inside the checkout; set SRPO_GRAPH_VSCODE_BUILD elsewhere" >&2
            exit 1 ;;
esac
# the sources as they are now (a file deleted here is deleted there too; node_modules stays)
find "$build" -mindepth 1 -maxdepth 1 ! -name node_modules -exec rm -rf {} +
tar -C "$src" --exclude=./node_modules --exclude='./*.vsix' -cf - . | tar -C "$build" -xf -
cd "$build"
if [ ! -f node_modules/.package-lock.json ] || ! cmp -s package-lock.json node_modules/.srpo-graph-lock.json; then
  npm ci --no-audit --no-fund
  cp package-lock.json node_modules/.srpo-graph-lock.json
fi
npm run --silent test:grammar
npm run --silent package
if cp srpo-graph-wf.vsix "$src/" 2>/dev/null; then
  echo "editors/vscode: packaged $src/srpo-graph-wf.vsix (built in $build)"
else
  echo "editors/vscode: the checkout is read-only: the package is $build/srpo-graph-wf.vsix"
fi
