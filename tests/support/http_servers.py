"""A real HTTP server on 127.0.0.1 for the client tests: a handler class (``http.server``) served in a
daemon thread, on a port the kernel picks."""

from __future__ import annotations

import http.server
import threading


class LocalServer:
    """``handler`` served on ``url`` (``http://127.0.0.1:PORT`` + ``path``) until :meth:`close`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], path: str = "") -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # (handler threads are daemons)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
