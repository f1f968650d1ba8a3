// The VS Code client of `srpo-graph lsp`: starts the language server over stdio for .wf files
// and adds "srpo-graph: Show the routing graph" (the `viz` SVG of the open file in a webview).
// Plain JavaScript (no build step); the server does all the language work.
"use strict";
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;
const panels = new Map(); // document uri -> webview panel

function settings() {
  const c = vscode.workspace.getConfiguration("srpoGraph");
  return {
    imports: c.get("imports"),
    allowedImports: c.get("allowedImports"),
    importTimeout: c.get("importTimeout"),
    debounce: c.get("debounce"),
    tokens: c.get("tokens"),
  };
}

function serverOptions() {
  const command = vscode.workspace.getConfiguration("srpoGraph").get("command") || ["srpo-graph"];
  return {
    command: command[0],
    args: [...command.slice(1), "lsp"],
    transport: TransportKind.stdio,
  };
}

async function start(context) {
  client = new LanguageClient(
    "srpoGraph",
    "srpo-graph",
    serverOptions(),
    {
      documentSelector: [{ language: "wf" }],
      initializationOptions: settings(),
      synchronize: { configurationSection: "srpoGraph" },
    }
  );
  await client.start();
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

function page(body) {
  return `<!DOCTYPE html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline';">
<style>body{background:#fff;color:#222;font-family:sans-serif} svg{max-width:100%;height:auto}</style>
</head><body>${body}</body></html>`;
}

async function render(uri) {
  const panel = panels.get(uri);
  if (!panel || !client) return;
  try {
    const out = await client.sendRequest("workspace/executeCommand", {
      command: "srpo-graph.graphSvg",
      arguments: [uri],
    });
    if (out && out.svg) {
      // the SVG comes from the server's own renderer (matplotlib); no scripts run in the webview
      panel.webview.html = page(out.svg.replace(/^<\?xml[^>]*>\s*/, "").replace(/<!DOCTYPE[^>]*>\s*/, ""));
    } else {
      panel.webview.html = page(`<p>No graph: ${escapeHtml(out ? out.error : "no answer")}</p>`);
    }
  } catch (e) {
    panel.webview.html = page(`<p>No graph: ${escapeHtml(e && e.message ? e.message : e)}</p>`);
  }
}

async function showGraph() {
  const editor = vscode.window.activeTextEditor;
  if (!editor || editor.document.languageId !== "wf") {
    vscode.window.showInformationMessage("Open a .wf file to see its routing graph.");
    return;
  }
  const uri = editor.document.uri.toString();
  let panel = panels.get(uri);
  if (!panel) {
    const name = editor.document.uri.path.split("/").pop();
    panel = vscode.window.createWebviewPanel("srpoGraph.graph", `Graph: ${name}`, vscode.ViewColumn.Beside, {
      enableScripts: false,
    });
    panels.set(uri, panel);
    panel.onDidDispose(() => panels.delete(uri));
  } else {
    panel.reveal(vscode.ViewColumn.Beside);
  }
  await render(uri);
}

async function activate(context) {
  await start(context);
  context.subscriptions.push(
    vscode.commands.registerCommand("srpoGraph.showGraph", showGraph),
    vscode.commands.registerCommand("srpoGraph.restartServer", async () => {
      if (client) await client.stop();
      await start(context);
    }),
    vscode.workspace.onDidSaveTextDocument((doc) => render(doc.uri.toString())),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration("srpoGraph.command") && client) {
        await client.stop();
        await start(context);
      }
    })
  );
}

async function deactivate() {
  if (client) await client.stop();
}

module.exports = { activate, deactivate };
