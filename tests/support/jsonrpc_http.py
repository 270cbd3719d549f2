"""A tiny loopback JSON-RPC over HTTP server for tests.

Serves any chain's `rpc(method, params) -> {"result"} | {"error"}` (e.g. `SolanaDevnet.rpc`) on
127.0.0.1 at a free port, so real RPC clients (solana-py, the x402 SDK's signers) can be pointed
at an in-process chain. Bodies, batches and ids are answered by `payments.devnet.jsonrpc`, as the
gateway's /devnet routes answer them. Use it as a context manager.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from payments.devnet import jsonrpc

MAX_BODY = 1024 * 1024


class JsonRpcHttpServer:
    """Serve `handler` as JSON-RPC over HTTP POST on a loopback port, in a daemon thread."""

    def __init__(self, handler: jsonrpc.Rpc, *, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.calls: list[str] = []  # method names in arrival order, for assertions
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._request_handler_class())
        self._server.daemon_threads = True
        self._connections: set[socket.socket] = set()  # open keep-alive connections
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> JsonRpcHttpServer:
        # A short poll interval keeps shutdown() (which waits for the next poll) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), name="jsonrpc-http", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()  # stops serve_forever and waits for it
            self._thread.join()
            self._thread = None
        self._server.server_close()
        # Clients keep connections alive; close them so no handler thread outlives the server.
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def __enter__(self) -> JsonRpcHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rpc(self, method: str, params: list[Any]) -> jsonrpc.Answer:
        """The chain's answer to one call, recorded in `calls`."""
        with self._lock:
            self.calls.append(method)
        return self.handler(method, params)

    def _request_handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as RPC clients pool connections
            disable_nagle_algorithm = True  # headers and body go out in two writes

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    reply = jsonrpc.refusal(413, jsonrpc.INVALID_REQUEST, "request too large")
                else:
                    try:
                        body = json.loads(self.rfile.read(length))
                    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                        reply = jsonrpc.refusal(400, jsonrpc.PARSE_ERROR, f"parse error: {exc}")
                    else:
                        reply = jsonrpc.answer(body, server.rpc)
                self._reply(reply.status, reply.body)

            def do_GET(self) -> None:  # noqa: N802
                # Solana nodes answer GET /health too.
                if self.path == "/health":
                    self._reply(200, "ok", content_type="text/plain")
                else:
                    self._reply(404, "not found", content_type="text/plain")

            def _reply(self, status: int, body: Any, content_type: str = "application/json") -> None:
                data = (json.dumps(body) if content_type == "application/json" else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep test output clean

        return Handler
