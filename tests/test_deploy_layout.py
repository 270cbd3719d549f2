"""deploy/ as an operator installs it, on loopback: Debian's nginx running the shipped
deploy/nginx/paywire.conf (only its host-specific values replaced) in front of two `paywire serve`
replicas in production mode, sharing one PostgreSQL database, settling on `paywire devnet`, their
keys (and the database URL) read from private files as the guide says, the schema created once
by `paywire db upgrade` (what paywire-migrate.service runs). Through https, with the test's CA
trusted: a paid marketplace call with `paywire pay` (the guide's check), a paid streamed chat
completion whose events arrive while the model is still writing (no buffering anywhere), both
replicas taking paid calls, the forwarded headers believed, /metrics and /admin refused.

Also checked without nginx: the systemd units (`systemd-analyze verify` when it is installed)
and the example settings file (every variable exists; its placeholders stop startup).
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from x402.schemas import PaymentRequired

from agent.devnet.server import SECRET_VARIABLES
from agent.settings import ConfigError, Settings
from payments.codec import decode_base64_any
from payments.devnet.keys import KEYS_FILE
from tests.faults.harness import Gateway, SolanaChain
from tests.support.live_server import LedgerReader
from tests.support.nginx import SHIPPED, Nginx, nginx_binary, render, start_nginx
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import SOL_NET, client_for, header, sign
from tests.support.postgres import PostgresServer
from tests.support.served_process import PAYWIRE, ROOT, free_port, paywire_env
from tests.support.webhook_targets import issue_certificates

DEPLOY = ROOT / "deploy"
RESOURCE = "/v1/marketplace/api/token-count-508"
OPENAI_KEY = "sk-deploy-test-key-from-a-file"
CLIENT_ADDRESS = "127.0.0.3"  # the test's client connects to nginx from here (all of 127/8 is loopback)
SPOOFED = "203.0.113.9"  # what a client claims in its own X-Forwarded-For: nginx must drop it


@dataclass
class Layout:
    nginx: Nginx
    replicas: list[Gateway]
    devnet: SolanaChain
    upstream: OpenAIUpstream
    url: str  # https://127.0.0.1:PORT: PAYWIRE_PUBLIC_URL
    http_url: str  # nginx's plain-HTTP server (redirects)
    ca_file: Path
    folder: Path
    payer_key_file: Path
    secrets: list[str]  # every value read from a key file: none may reach a log
    reader: LedgerReader

    def client(self, **kwargs: Any) -> httpx.Client:
        """An https client trusting the test's CA, connecting from CLIENT_ADDRESS."""
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        transport = httpx.HTTPTransport(verify=tls, local_address=CLIENT_ADDRESS)
        return httpx.Client(base_url=self.url, transport=transport, timeout=30, **kwargs)

    def replica_of(self, owner: str) -> str:
        """Which replica a ledger `owner` (host:pid:suffix) is."""
        pid = int(owner.split(":")[1])
        return next(r.name for r in self.replicas if r.proc is not None and r.proc.pid == pid)

    def served(self, request_id: str) -> str:
        """Which replica nginx passed a request to (its access log: replica=ADDRESS id=ID). nginx
        writes the line in its log phase, which may come after the client has the whole answer:
        the log is read again until the line is there (10 s at most)."""
        deadline = time.monotonic() + 10
        while not (line := next((ln for ln in self.nginx.log().splitlines()
                                 if ln.endswith(f" id={request_id}")), None)):
            assert time.monotonic() < deadline, f"nginx logged no request {request_id} in 10 s"
            time.sleep(0.02)
        address = line.split(" replica=", 1)[1].split(" ", 1)[0]
        return next(r.name for r in self.replicas if address == f"127.0.0.1:{r.port}")


def _key_file(folder: Path, name: str, value: str) -> Path:
    """A key file as the guide makes one: the value and a newline, mode 0400."""
    path = folder / name
    path.write_text(value + "\n")
    path.chmod(0o400)
    return path


@pytest.fixture(scope="module")
def layout(postgres_server: PostgresServer) -> Iterator[Layout]:
    binary = nginx_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is not installed: `make nginx` installs Debian's package")
        pytest.skip("nginx is not installed (`make nginx`, or apt-get install nginx); CI fails here")
    # Not under pytest's private basetemp: nginx's workers and the replicas read from here.
    folder = Path(tempfile.mkdtemp(prefix="paywire-deploy-"))
    keys = folder / "keys"
    keys.mkdir(mode=0o700)
    started: list[Any] = []
    try:
        devnet = SolanaChain(folder / "devnet")
        started.append(devnet)
        upstream = OpenAIUpstream("openai").start()
        started.append(upstream)
        upstream.behaviour.require_key = OPENAI_KEY  # answered only if the key file was read
        https_port, http_port = free_port(), free_port()
        url = f"https://127.0.0.1:{https_port}"
        db_url = postgres_server.fresh_url()
        secrets = [devnet.env[name] for name in SECRET_VARIABLES] + [OPENAI_KEY]
        env = {name: value for name, value in devnet.env.items() if name not in SECRET_VARIABLES}
        env |= {
            "PAYWIRE_EVM_FACILITATOR_KEY_FILE": str(_key_file(
                keys, "evm-facilitator", devnet.env["PAYWIRE_EVM_FACILITATOR_KEY"])),
            "PAYWIRE_SOLANA_FACILITATOR_KEY_FILE": str(_key_file(
                keys, "solana-facilitator", devnet.env["PAYWIRE_SOLANA_FACILITATOR_KEY"])),
            "PAYWIRE_DATABASE_URL_FILE": str(_key_file(keys, "database-url", db_url)),
            "OPENAI_API_KEY_FILE": str(_key_file(keys, "openai", OPENAI_KEY)),
            "OPENAI_BASE_URL": upstream.url,
            "PAYWIRE_PUBLIC_URL": url,
            "PAYWIRE_TRUSTED_PROXIES": "127.0.0.1",
            "PAYWIRE_LOG_FORMAT": "json",
        }
        # paywire-migrate.service: the schema once, before any replica starts.
        migrate = subprocess.run([*PAYWIRE, "db", "upgrade"], env=paywire_env(folder / "migrate", **env),
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        replicas = [Gateway(f"replica-{i}", env, folder) for i in (1, 2)]
        started += replicas
        threads = [threading.Thread(target=r.start) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(r.alive for r in replicas), "\n".join(r.log_tail() for r in replicas)

        ca_file, cert, key = issue_certificates(folder)
        site = render(SHIPPED.read_text(), {
            "server 127.0.0.1:8001": f"server 127.0.0.1:{replicas[0].port}",
            "server 127.0.0.1:8002": f"server 127.0.0.1:{replicas[1].port}",
            "listen 443 ssl;": f"listen 127.0.0.1:{https_port} ssl;",
            "listen 80;": f"listen 127.0.0.1:{http_port};",
            "/etc/letsencrypt/live/paywire.example.com/fullchain.pem": str(cert),
            "/etc/letsencrypt/live/paywire.example.com/privkey.pem": str(key),
            "/var/log/nginx/": f"{folder / 'nginx'}/",
        })
        nginx = start_nginx(binary, folder / "nginx", site, [https_port, http_port])
        started.append(nginx)
        payer = json.loads((folder / "devnet" / "data" / KEYS_FILE).read_text())["evm_payer"]
        reader = LedgerReader(db_url)
        started.append(reader)
        yield Layout(nginx, replicas, devnet, upstream, url, f"http://127.0.0.1:{http_port}",
                     ca_file, folder, _key_file(keys, "payer", payer), secrets + [payer], reader)
    finally:
        for part in reversed(started):
            if isinstance(part, Gateway):
                part.stop()
            elif isinstance(part, SolanaChain | LedgerReader):
                part.close()
            else:
                part.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _pay_with_cli(layout: Layout, body: dict[str, Any]) -> dict[str, Any]:
    """`paywire pay` against the public https URL, as deploy/README.md's check: the CA trusted
    through SSL_CERT_FILE, the payer's key from a file."""
    env = paywire_env(layout.folder / "payer", SSL_CERT_FILE=str(layout.ca_file),
                      PAYWIRE_PAYER_KEY_FILE=str(layout.payer_key_file))
    env.pop("PAYWIRE_PAYER_KEY", None)
    done = subprocess.run([*PAYWIRE, "pay", f"{layout.url}{RESOURCE}", "--data", json.dumps(body),
                           "--network", "evm", "--json"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"paywire pay failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def _stream_paid_chat(layout: Layout, http: httpx.Client, not_on: str
                      ) -> tuple[httpx.Headers, list[str]]:
    """Quote a streamed chat completion through nginx, pay it on Solana (on another replica than
    `not_on`), and read its events: the model (the loopback upstream) writes its first token,
    then waits for the gate; the first token must reach this client through nginx while the
    model waits. Returns the answer's headers and the text of its events."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "deploy me"}],
            "stream": True, "max_tokens": 8}
    headers = {"X-Forwarded-For": SPOOFED}
    quoted = http.post("/v1/chat/completions", json=body,
                       headers={**headers, "X-Request-Id": "deploy-test-quote"})
    assert quoted.status_code == 402, quoted.text
    assert quoted.headers["X-Request-Id"] == "deploy-test-quote"
    # its x402 bazaar description makes the header larger than nginx's default proxy buffer (4k)
    assert len(quoted.headers["PAYMENT-REQUIRED"]) > 4096
    # nginx takes turns (round robin): the paid request goes to the replica after the quote's.
    # If that is `not_on`, one request in between moves it on.
    if layout.served("deploy-test-quote") != not_on:
        ready = http.get("/readyz", headers={"X-Request-Id": "deploy-test-readyz"})
        assert ready.status_code == 200 and ready.json() == {"ready": True}, ready.text
        assert ready.headers["X-Request-Id"] == "deploy-test-readyz"
    required = PaymentRequired.model_validate(
        json.loads(decode_base64_any(quoted.headers["PAYMENT-REQUIRED"])))
    assert required.resource is not None and required.resource.url.startswith(f"{layout.url}/"), \
        "quotes must name the public https URL (PAYWIRE_PUBLIC_URL)"
    payer = layout.devnet.new_payer(2 * int(required.accepts[0].amount) + 1_000_000)
    signer = client_for(layout.url, sol_key=payer, sol_rpc=layout.devnet.rpc_url)
    paid = header(sign(signer, required, SOL_NET))
    gate = threading.Event()
    layout.upstream.stream_finished.clear()
    layout.upstream.behaviour.gate = gate
    events: list[str] = []
    try:
        with http.stream("POST", "/v1/chat/completions", json=body,
                         headers={**headers, "PAYMENT-SIGNATURE": paid}) as answer:
            assert answer.status_code == 200, answer.read().decode()
            lines = answer.iter_lines()
            try:
                for line in lines:
                    if line.startswith("data: "):
                        events.append(line.removeprefix("data: "))
                        if "Hello from openai." in line:
                            break
            except httpx.ReadTimeout:
                raise AssertionError("the first event did not arrive while the model was still "
                                     "writing: something between paywire and the client buffers "
                                     "the stream") from None
            assert not gate.is_set() and not layout.upstream.stream_finished.is_set()
            gate.set()  # now the model finishes
            events += [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
            return answer.headers, events
    finally:
        layout.upstream.behaviour.gate = None
        gate.set()


def _receipt(headers: httpx.Headers) -> dict[str, Any]:
    return json.loads(decode_base64_any(headers["PAYMENT-RESPONSE"]))


def test_paid_calls_through_nginx(layout: Layout) -> None:
    # A paid marketplace call with `paywire pay` (EVM): a quote, then the paid request.
    paid = _pay_with_cli(layout, {"text": "Behind nginx, paid on Base", "model": "gpt-4o"})
    assert paid["status"] == 200 and paid["result"]["tokens"] > 0, paid
    assert paid["receipt"]["success"] and paid["receipt"]["network"] == "eip155:84532"
    evm_tx = paid["receipt"]["transaction"]

    first = layout.replica_of(str(next(r for r in layout.reader.rows()
                                       if r["tx_hash"] == evm_tx)["owner"]))
    with layout.client() as http:
        headers, events = _stream_paid_chat(layout, http, not_on=first)
    receipt = _receipt(headers)
    assert receipt["success"] and receipt["network"] == SOL_NET
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e).get("choices"))
    assert text == "Hello from openai. 1 2 3"
    assert len(headers["X-Request-Id"]) == 32  # made by nginx ($request_id): the client sent none

    # The ledger: both payments settled, one by each replica.
    rows = {str(r["tx_hash"]): r for r in layout.reader.rows()}
    settled = [rows[evm_tx], rows[receipt["transaction"]]]
    assert [str(r["state"]) for r in settled] == ["settled", "settled"]
    owners = {layout.replica_of(str(r["owner"])) for r in settled}
    assert owners == {"replica-1", "replica-2"}, (
        f"paid calls were all settled by {owners}; nginx's log:\n{layout.nginx.log()}")

    # X-Forwarded-For reached paywire and was believed (PAYWIRE_TRUSTED_PROXIES=127.0.0.1):
    # uvicorn's access line names the test's address, not nginx's; what the client claimed
    # itself was replaced by nginx, so it appears nowhere.
    access = [line for r in layout.replicas for line in _json_lines(r.log())
              if line.get("logger") == "uvicorn.access" and line.get("path") == "/v1/chat/completions"]
    assert access and all(str(line["client"]).startswith(f"{CLIENT_ADDRESS}:") for line in access), access
    assert all(SPOOFED not in r.log() for r in layout.replicas)
    # The request id is one across nginx's log, paywire's log and the answer.
    assert any(line.get("request_id") == "deploy-test-quote"
               for r in layout.replicas for line in _json_lines(r.log()))


def test_operator_paths_tls_and_startup_banner(layout: Layout) -> None:
    with layout.client() as http:
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"ready": True}, ready.text
        # /metrics and /admin are not for the public: nginx refuses them (the replicas serve
        # /metrics on their own addresses, for the operator's scraper).
        for path in ("/metrics", "/admin", "/admin/skills/disabled"):
            assert http.get(path).status_code == 403, path
        # X-Forwarded-Proto reached paywire: a redirect paywire makes names https.
        slash = http.get("/readyz/", follow_redirects=False)
        assert slash.status_code in (307, 308) and slash.headers["Location"].startswith("https://"), (
            slash.status_code, slash.headers)
    direct = httpx.get(f"{layout.replicas[0].url}/metrics", timeout=10)
    assert direct.status_code == 200 and "paywire_" in direct.text
    # Plain HTTP only redirects to https.
    redirect = httpx.get(f"{layout.http_url}/readyz", follow_redirects=False, timeout=10)
    assert redirect.status_code == 301
    assert redirect.headers["Location"] == "https://127.0.0.1/readyz"
    acme = httpx.get(f"{layout.http_url}/.well-known/acme-challenge/none", timeout=10)
    assert acme.status_code == 404  # certbot's webroot is served, not redirected
    # An untrusted certificate is refused (the test's CA is what makes the others work).
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{layout.url}/readyz", timeout=10)

    # Each replica announced its production settings (one JSON line: the logs are JSON), with
    # the signers' addresses and never a key; no key reached any log.
    for replica in layout.replicas:
        banner = next(line["startup"] for line in _json_lines(replica.log())
                      if line.get("logger") == "paywire.startup")
        assert banner["public_url"] == layout.url
        assert "eip155:84532" in banner["networks"] and SOL_NET in banner["networks"]
        assert banner["facilitator"].startswith("in process: EVM signer 0x")
        assert "PostgreSQL: replicas may share it" in banner["database"]
        assert "providers configured: openai" in banner["sold"]
    logs = [r.log() for r in layout.replicas] + [layout.nginx.log(), layout.nginx.log("error.log")]
    for secret in layout.secrets:
        assert not any(secret in log for log in logs)


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


# ------------------------------------------------------------------ the files, without nginx


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def test_systemd_units(tmp_path: Path) -> None:
    replica, migrate = _unit("paywire@.service"), _unit("paywire-migrate.service")
    assert replica["Service"]["ExecStart"] == "/opt/paywire/venv/bin/paywire serve --port %i"
    assert migrate["Service"]["ExecStart"] == "/opt/paywire/venv/bin/paywire db upgrade"
    assert migrate["Service"]["Type"] == "oneshot" and migrate["Service"]["RemainAfterExit"] == "yes"
    assert "paywire-migrate.service" in replica["Unit"]["Wants"].split()
    assert "Requires" not in replica["Unit"]  # restarting the migration must not restart replicas
    assert "paywire-migrate.service" in replica["Unit"]["After"].split()
    for unit in (replica, migrate):
        service = unit["Service"]
        assert service["User"] == "paywire" and service["EnvironmentFile"] == "/etc/paywire/paywire.env"
        assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
        assert service["PrivateTmp"] == "yes" and service["ReadWritePaths"] == "/var/lib/paywire"
    assert replica["Service"]["Restart"] == "on-failure"
    assert replica["Service"]["RestartPreventExitStatus"] == "2"  # a configuration error

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # parsed above; the binary (package systemd) is not in every container
    paywire = Path(PAYWIRE[0]).parent / "paywire"
    assert paywire.exists(), "the paywire console script (pip install -e .)"
    for name, as_name in (("paywire@.service", "paywire@8001.service"),
                          ("paywire-migrate.service", "paywire-migrate.service")):
        text = (DEPLOY / "systemd" / name).read_text()
        (tmp_path / as_name).write_text(text.replace("/opt/paywire/venv/bin/paywire", str(paywire)))
    checked = subprocess.run([analyze, "verify", "paywire@8001.service", "paywire-migrate.service"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    ours = [line for line in (checked.stdout + checked.stderr).splitlines() if "paywire" in line]
    assert checked.returncode == 0 and not ours, checked.stdout + checked.stderr


def test_example_settings_file() -> None:
    """Every variable of deploy/systemd/paywire.env.example exists; its placeholder addresses
    stop startup naming both variables (nobody is paid at an example address)."""
    lines = [line.strip() for line in (DEPLOY / "systemd" / "paywire.env.example").read_text().splitlines()]
    assignments = [line.removeprefix("#") for line in lines if "=" in line and " " not in line]
    known = {variable for variable, _, _ in Settings.reference()}
    from_file = {f"{variable}_FILE" for variable in Settings.file_variables()}
    env = dict(line.split("=", 1) for line in assignments)
    assert set(env) <= known | from_file, sorted(set(env) - known - from_file)
    active = {name: value for name, value in
              (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
              if not name.endswith("_FILE")}  # the key files are the operator's to make
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(active)
    assert "PAYWIRE_EVM_PAY_TO" in str(refused.value) and "PAYWIRE_SOLANA_PAY_TO" in str(refused.value)
