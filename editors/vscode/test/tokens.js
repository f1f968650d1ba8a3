// Tokenize .wf files with the extension's TextMate grammar, as VS Code does (vscode-textmate +
// the Oniguruma regex engine), and print the tokens as JSON:
//   [{file, lines: [[[startIndex, endIndex, [scopes...]], ...], ...]}, ...]
// Used by tests/lsp/test_vscode_grammar.py to compare the grammar with the parser's own tokens.
// Usage: node test/tokens.js FILE.wf ...
"use strict";
const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const grammarPath = path.join(__dirname, "..", "syntaxes", "wf.tmLanguage.json");
const wasm = fs.readFileSync(require.resolve("vscode-oniguruma/release/onig.wasm")).buffer;

async function main(files) {
  await oniguruma.loadWASM(wasm);
  const registry = new vsctm.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
      createOnigString: (s) => new oniguruma.OnigString(s),
    }),
    loadGrammar: async (scopeName) =>
      scopeName === "source.wf"
        ? vsctm.parseRawGrammar(fs.readFileSync(grammarPath, "utf8"), grammarPath)
        : null,
  });
  const grammar = await registry.loadGrammar("source.wf");
  const out = [];
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8");
    let state = vsctm.INITIAL;
    const lines = [];
    for (const line of text.split(/\r\n|\r|\n/)) {
      const r = grammar.tokenizeLine(line, state);
      lines.push(r.tokens.map((t) => [t.startIndex, Math.min(t.endIndex, line.length), t.scopes]));
      state = r.ruleStack;
    }
    out.push({ file, lines });
  }
  process.stdout.write(JSON.stringify(out));
}

main(process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
