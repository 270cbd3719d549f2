"""Plumbing for the third-party stand-ins: a real HTTP server on a free 127.0.0.1 port, served
from a daemon thread, and a handler base that answers JSON (or raw bytes) quietly."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JSONHandler(BaseHTTPRequestHandler):
    def answer(self, status: int, doc: Any, content_type: str = "application/json") -> None:
        """`doc` as JSON, or as it is when it is bytes; a client that already left is ignored."""
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. it timed out): nothing to answer

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
