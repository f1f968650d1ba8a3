"""Shared helpers of the language-server tests: a real server (``srpo-graph lsp``) in a child
process, driven over stdio by pytest-lsp's client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types as lsp

pytest.importorskip("pytest_lsp")
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

from tests.support.lsp_wire import ENV, ROOT, SERVER  # noqa: E402,F401  (the server command, shared)


def config() -> ClientServerConfig:
    return ClientServerConfig(server_command=SERVER, server_env=ENV)


async def start(client: LanguageClient, options: dict | None = None) -> None:
    await client.initialize_session(lsp.InitializeParams(
        capabilities=lsp.ClientCapabilities(general=lsp.GeneralClientCapabilities(
            position_encodings=[lsp.PositionEncodingKind.Utf16])),
        initialization_options=options))


class Docs:
    """Open, change and wait for the diagnostics of documents on one client."""

    def __init__(self, client: LanguageClient):
        self.client = client
        self.versions: dict[str, int] = {}

    async def _published(self, uri: str, version: int, timeout: float = 60.0) -> list[lsp.Diagnostic]:
        async def wait():
            while True:
                got = self.published.get(uri)
                if got is not None and got[0] == version:
                    return got[1]
                await self.client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)

        return await asyncio.wait_for(wait(), timeout)

    @property
    def published(self) -> dict[str, tuple[int | None, list[lsp.Diagnostic]]]:
        return self.client.published  # type: ignore[attr-defined]

    async def open(self, path: Path, text: str | None = None) -> tuple[str, list[lsp.Diagnostic]]:
        uri = path.resolve().as_uri()
        text = path.read_text(encoding="utf-8") if text is None else text
        self.versions[uri] = 1
        self.published.pop(uri, None)  # a publish of an earlier opening must not count as this one's
        self.client.text_document_did_open(lsp.DidOpenTextDocumentParams(text_document=lsp.TextDocumentItem(
            uri=uri, language_id="wf", version=1, text=text)))
        return uri, await self._published(uri, 1)

    def change(self, uri: str, text: str) -> int:
        self.versions[uri] += 1
        v = self.versions[uri]
        self.client.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=v),
            content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))
        return v

    async def diagnostics_of(self, uri: str, version: int) -> list[lsp.Diagnostic]:
        return await self._published(uri, version)

    def close(self, uri: str) -> None:
        self.client.text_document_did_close(lsp.DidCloseTextDocumentParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri)))


def record_publishes(client: LanguageClient) -> None:
    """Keep every publish with its version (pytest-lsp keeps the last diagnostics only)."""
    client.published = {}  # type: ignore[attr-defined]
    client.publish_log = []  # type: ignore[attr-defined]
    original = client.protocol.fm.features[lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS]

    def on_publish(params: lsp.PublishDiagnosticsParams):
        client.published[params.uri] = (params.version, list(params.diagnostics))  # type: ignore[attr-defined]
        client.publish_log.append((params.uri, params.version))  # type: ignore[attr-defined]
        return original(params)

    client.protocol.fm.features[lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = on_publish
