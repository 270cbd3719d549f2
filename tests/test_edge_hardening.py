"""What enters is bounded before anything parses it, against `paywire serve` as a real process (a
crash would be a dead process), on the devnet and in production mode: deep bodies, huge numbers
and slow clients on every JSON route, errors in each route's own shape, and one warning line per
malformed request in the log."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator

from payments.devnet import Devnet
from payments.devnet.keys import DevnetKeys
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.facilitator_server import facilitator_app
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.served_process import free_port, paywire_env, start_paywire, stop

HEADER_TIMEOUT, BODY_TIMEOUT = 1, 2  # seconds, small so the slow-client tests finish fast

# Every route that reads a JSON body, and the shape its errors take.
OPENAI_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/edits", "/v1/embeddings",
                 "/v1/audio/speech", "/v1/audio/generations", "/v1/images/generations"]
MARKETPLACE_ROUTES = ["/v1/marketplace/api/token-count-508", "/v1/marketplace/api/help"]
RPC_ROUTES = ["/a2a", "/a2a/", "/devnet/evm", "/devnet/solana"]
FAUCET = "/devnet/faucet"
JSON_ROUTES = OPENAI_ROUTES + MARKETPLACE_ROUTES + RPC_ROUTES + [FAUCET]


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[str]
    log: Path
    mode: str

    def serves(self, path: str) -> bool:
        return self.mode == "devnet" or not path.startswith("/devnet")

    def alive(self) -> None:
        """The process is still running and still answers."""
        assert self.proc.poll() is None, f"paywire died with exit code {self.proc.returncode}"
        assert httpx.get(f"{self.url}/health", timeout=5).json()["status"] == "ok"

    def log_text(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def _production_settings() -> Iterator[dict[str, str]]:
    """A production configuration: real network names, pay-to addresses, and a remote
    facilitator (the SDK's, over HTTP on loopback)."""
    devnet = Devnet(DevnetKeys.generate())
    evm_signer, svm_signer = devnet.signers()
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, evm_signer, networks=[BASE_SEPOLIA.caip2])
    register_exact_svm_facilitator(facilitator, svm_signer, networks=[SOLANA_DEVNET.caip2])
    sock, port = bound_socket()
    server, thread = run_in_thread(facilitator_app(facilitator), sock)
    try:
        yield {"PAYWIRE_NETWORKS": "base-sepolia,solana-devnet",
               "PAYWIRE_EVM_PAY_TO": devnet.keys.evm_merchant_address,
               "PAYWIRE_SOLANA_PAY_TO": devnet.keys.sol_merchant_address,
               "PAYWIRE_FACILITATOR_URL": f"http://127.0.0.1:{port}"}
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module", params=["devnet", "production"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("edge")
    port = free_port()
    with contextlib.ExitStack() as stack:
        extra = stack.enter_context(_production_settings()) if request.param == "production" else {}
        env = paywire_env(root / ".paywire", PAYWIRE_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
                          PAYWIRE_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT), **extra)
        log = root / "serve.log"
        sink = stack.enter_context(log.open("w"))
        proc = start_paywire(port, env, stdout=sink, stderr=sink)
        yield Gateway(f"http://127.0.0.1:{port}", proc, log, request.param)
        stop(proc)


def _post(gateway: Gateway, path: str, body: bytes, headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", content=body, timeout=30,
                      headers={"content-type": "application/json", **(headers or {})})


def _refused(path: str) -> int:
    """The HTTP status of a refused body: /a2a answers its JSON-RPC errors in 200 (the A2A TCK's
    rule, agent/edge/http_io.py), every other route 400."""
    return 200 if path.rstrip("/") == "/a2a" else 400


def _assert_route_shape(path: str, response: httpx.Response, mentions: str) -> None:
    """The error is JSON in the route's shape, and its message says what limit was hit."""
    body = response.json()
    if path in RPC_ROUTES:
        assert body["jsonrpc"] == "2.0" and body["id"] is None
        assert body["error"]["code"] in (-32700, -32600)
        assert mentions in body["error"]["message"]
        return
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if path == FAUCET:
        assert error["param"] == "body"
        return
    assert mentions in error["message"]
    if path in MARKETPLACE_ROUTES:
        assert body["success"] is False


DEEP_BODIES = {
    "arrays 50,000 deep": b"[" * 50_000 + b"]" * 50_000,
    "objects 20,000 deep": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "unclosed, 100,000 deep": b'{"messages": ' + b"[" * 100_000,
    "65 deep inside a valid body": b'{"model": "gpt-4o", "x": ' + b"[" * 65 + b"]" * 65 + b"}",
}


@pytest.mark.parametrize("path", JSON_ROUTES)
def test_deep_bodies_are_refused_and_the_server_lives(gateway: Gateway, path: str) -> None:
    if not gateway.serves(path):
        pytest.skip("the devnet's routes are served on the devnet only")
    for name, body in DEEP_BODIES.items():
        response = _post(gateway, path, body)
        assert response.status_code == _refused(path), (name, response.text)
        _assert_route_shape(path, response, "nested deeper than 64")
    gateway.alive()


def test_brackets_inside_strings_are_not_nesting(gateway: Gateway) -> None:
    text = "[{" * 5_000  # looks deep, is only a string
    quote = _post(gateway, "/v1/marketplace/api/token-count-508",
                  json.dumps({"text": text, "model": "gpt-4o"}).encode())
    assert quote.status_code == 402  # a valid request: quoted


BIG = "9" * 5_000
BIG_NUMBER_BODIES = {
    "/v1/chat/completions": f'{{"model": "gpt-4o-mini", "messages": [{{"role": "user", '
                            f'"content": "hi"}}], "max_tokens": {BIG}}}',
    "/v1/marketplace/api/token-count-508": f'{{"text": "hi", "model": "gpt-4o", "n": {BIG}}}',
    "/a2a": f'{{"jsonrpc": "2.0", "id": {BIG}, "method": "message/send", "params": {{}}}}',
    "/devnet/evm": f'{{"jsonrpc": "2.0", "id": {BIG}, "method": "eth_chainId"}}',
    "/devnet/solana": f'{{"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [{BIG}]}}',
}


@pytest.mark.parametrize("path", sorted(BIG_NUMBER_BODIES))
@pytest.mark.parametrize("digits", [101, 4_000, 5_000])
def test_huge_numbers_are_refused_not_a_500(gateway: Gateway, path: str, digits: int) -> None:
    if not gateway.serves(path):
        pytest.skip("the devnet's routes are served on the devnet only")
    body = BIG_NUMBER_BODIES[path].replace(BIG, "9" * digits)
    response = _post(gateway, path, body.encode())
    assert response.status_code == _refused(path), response.text
    _assert_route_shape(path, response, "longer than 100 digits")
    gateway.alive()


@pytest.mark.parametrize("request_id", [2**64, -(2**63) - 1, 1.5, True, "x" * 300])
def test_a2a_ids_that_no_client_can_carry_are_refused(gateway: Gateway, request_id: object) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tasks/get",
                       "params": {"id": "t"}}).encode()
    response = _post(gateway, "/a2a", body)
    assert response.status_code == 200
    assert response.json()["error"]["code"] == -32600
    assert "'id'" in response.json()["error"]["message"]


def _read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout is the
    deadline: the test waits on the close, not on a clock)."""
    sock.settimeout(deadline)
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def _connect(gateway: Gateway) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_a_client_that_never_finishes_its_headers_is_cut_off(gateway: Gateway) -> None:
    with _connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        answer = _read_until_closed(sock, HEADER_TIMEOUT + 10)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer and b"headers not received" in answer
    assert time.monotonic() - started < HEADER_TIMEOUT + 5
    gateway.alive()


def test_a_client_that_never_finishes_its_body_is_cut_off(gateway: Gateway) -> None:
    with _connect(gateway) as sock:
        sock.sendall(b"POST /v1/marketplace/api/token-count-508 HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"text\": ")
        answer = _read_until_closed(sock, BODY_TIMEOUT + 10)
    # The handler was reading the body when the deadline closed the connection: it answers
    # nothing more (its client is gone), or the 408 if nothing had been sent yet.
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")
    gateway.alive()


def test_many_idle_connections_are_all_released(gateway: Gateway) -> None:
    sockets = [_connect(gateway) for _ in range(200)]
    try:
        for sock in sockets[:100]:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # half a request each
        for sock in sockets:
            _read_until_closed(sock, HEADER_TIMEOUT + 10)
    finally:
        for sock in sockets:
            sock.close()
    gateway.alive()


@pytest.mark.parametrize(("method", "path", "status", "shape"), [
    ("GET", "/v1/no-such-route", 404, "openai"),
    ("GET", "/v1/chat/completions", 405, "openai"),
    ("GET", "/v1/marketplace/api/token-count-508", 405, "marketplace"),
    ("GET", "/nothing-here", 404, "openai"),
    ("PUT", "/a2a", 405, "jsonrpc"),
])
def test_errors_outside_any_route_are_in_the_route_shape(gateway: Gateway, method: str, path: str,
                                                         status: int, shape: str) -> None:
    response = httpx.request(method, f"{gateway.url}{path}", timeout=10)
    assert response.status_code == status
    body = response.json()
    if shape == "jsonrpc":
        assert body["error"]["code"] == -32600 and method in body["error"]["message"]
        return
    assert body["error"]["code"] == {404: "not_found", 405: "method_not_allowed"}[status]
    assert path in body["error"]["message"]
    assert ("success" in body) == (shape == "marketplace")


DEEP_HEADER = base64.b64encode(b"[" * 1200 + b"]" * 1200).decode()  # 3 KB


def test_malformed_requests_are_one_warning_line_each_not_tracebacks(gateway: Gateway) -> None:
    before = gateway.log_text()
    send = (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {'
            b'"role": "user", "messageId": "m", "parts": [{"kind": "data", "data": {'
            b'"skill": "token-count-508", "input": {"text": "hi", "model": "gpt-4o"}}}]}}}')
    quote = b'{"text": "hi", "model": "gpt-4o"}'
    bad = [
        ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": 5}}', {}),
        ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": "x"}', {}),
        ("/a2a", b'{"jsonrpc": "1.0", "id": 1, "method": "tasks/get"}', {}),
        ("/a2a", b"not json", {}),
        ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": ["tasks/get"], "params": {}}', {}),
        ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": {"a": 1}, "params": {}}', {}),
        ("/a2a", send, {"PAYMENT-SIGNATURE": DEEP_HEADER}),
        ("/a2a", b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t"}}',
         {"SIGN-IN-WITH-X": DEEP_HEADER}),
        ("/v1/marketplace/api/token-count-508", quote, {"X-PAYMENT": DEEP_HEADER}),
        ("/v1/marketplace/api/token-count-508", quote, {"PAYMENT-SIGNATURE": DEEP_HEADER}),
        ("/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": ["x"], "params": {}}', {}),
        ("/v1/chat/completions", b"[1, 2", {}),
        ("/devnet/evm", b'{"jsonrpc": "2.0", "id": 1, "method": 5}', {}),
    ]
    bad = [(path, body, headers) for path, body, headers in bad if gateway.serves(path)]
    for path, body, headers in bad:
        response = _post(gateway, path, body, headers)
        assert response.status_code < 500, (path, body, response.text)
    gateway.alive()
    added = gateway.log_text()[len(before):]
    lines = added.strip().splitlines()
    assert "Traceback" not in added
    assert all(line.split()[2] == "WARNING" for line in lines), added  # date time LEVEL name: ...
    assert len(lines) <= len(bad)  # at most one line each
    assert "parseError" not in added and "Incorrect" not in added  # the request is not quoted
