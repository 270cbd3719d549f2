"""Webhook receivers for tests: real HTTP and HTTPS servers on free 127.0.0.1 ports.

Paths (both servers): /hook answers 200 and records what it got, /empty answers 204, /fail 500,
/redirect 302 to /hook, /big 200 with a 256 KiB body, /hang holds the request until `release` is
set (at teardown, or by the test). The HTTPS server's certificate is issued at test time by a
throwaway CA (`ca_file`) for 127.0.0.1 and localhost: trusted only where that CA is added.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BIG_BODY = b"x" * (256 * 1024)
LEAF_CN = "paywire webhook test"
CA_CN = "paywire test CA"


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Targets:
    http_url: str
    https_url: str
    ca_file: Path
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)

    def close(self) -> None:
        self.release.set()  # let held /hang handlers finish before the servers go
        for server in self._servers:
            server.shutdown()
            server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK wait
    server: _Server

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in the request's thread, not in the accept loop
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?", 1)[0]
        if path == "/hook":
            self.server.targets.received.append(
                Received(self.command, self.path, dict(self.headers.items()), body))
            self._answer(200, b'{"received": true}', {"X-Receiver": "paywire-test"})
        elif path == "/empty":
            self._answer(204, b"")
        elif path == "/fail":
            self._answer(500, b"internal error: the receiver crashed", content_type="text/plain")
        elif path == "/redirect":
            self._answer(302, b"", {"Location": "/hook"})
        elif path == "/big":
            self._answer(200, BIG_BODY, content_type="text/plain")
        elif path == "/hang":
            self.server.targets.release.wait(30)
            self._answer(200, b"{}")
        else:
            self._answer(404, b"not found", content_type="text/plain")

    do_PUT = do_PATCH = do_POST  # noqa: N815

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None,
                content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            for name, value in {"Content-Type": content_type, **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a timeout test, a capped read): nothing to answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, targets: Targets, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.targets = targets
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True,
                                          do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # failed handshakes (the untrusted-certificate tests) are expected

    @property
    def port(self) -> int:
        return self.server_address[1]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "paywire tests")])


def _certificate(subject: str, issuer: str, public_key: Any, signing_key: Any, *, ca: bool
                 ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issue_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) PEM files, made now."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(CA_CN, CA_CN, ca_key.public_key(), ca_key, ca=True)
    leaf = _certificate(LEAF_CN, CA_CN, leaf_key.public_key(), ca_key, ca=False)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(_pem(ca))
    paths[1].write_bytes(_pem(leaf))
    paths[2].write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return paths


def start_targets(folder: Path) -> Targets:
    ca_file, cert_file, key_file = issue_certificates(folder)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    targets = Targets(http_url="", https_url="", ca_file=ca_file)
    plain, secure = _Server(targets), _Server(targets, tls)
    targets.http_url = f"http://127.0.0.1:{plain.port}"
    targets.https_url = f"https://127.0.0.1:{secure.port}"
    for server in (plain, secure):
        targets._servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
    return targets
