"""webhook-test-payload: a paid call sends the payload to a real receiver on loopback and reports
it; remote failures (non-2xx, redirect, TLS, timeout) are diagnosed and charged; private and
metadata addresses are refused before the quote, names that resolve to them at run time, and
neither is charged. Plus the address rules of skills.net_guard.

Only 127.0.0.1 is ever connected to. Names other than 'localhost' are resolved by a stand-in
getaddrinfo on the test's own event loop (no real DNS); the forbidden addresses in the gateway
tests are refused before any payment, so nothing tries to reach them."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import httpx
import pytest

from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from skills import net_guard
from skills.errors import SkillInputError, SkillUnavailableError, UpstreamError
from skills.resource_context import ResourceContext
from skills.resource_files import check_resource
from skills.resources import webhook_test
from skills.resources.webhook_test import ALLOW_ENV, CA_FILE_ENV, Exchange, diagnose, run
from tests.support.live_server import LiveServer, bound_socket, start_server
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, post_paid, quote, receipt, sign
from tests.support.webhook_targets import LEAF_CN, Targets, start_targets

PATH = "/v1/marketplace/api/webhook-test-payload"
PRICE = 62101  # $0.062101 in atomic USDC
LOOPBACK = {ALLOW_ENV: "127.0.0.1/32"}
RESOURCE_FILE = Path(__file__).parent.parent / "skills" / "builtin" / "webhook-test-payload.json"


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    live = start_targets(tmp_path_factory.mktemp("webhook-targets"))
    yield live
    live.close()


@pytest.fixture(scope="module")
def gateway(targets: Targets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A gateway that may reach 127.0.0.1 and trusts the test CA."""
    live = start_server(tmp_path_factory.mktemp("paywire-webhook"),
                        env={**LOOPBACK, CA_FILE_ENV: str(targets.ca_file)})
    yield live
    live.stop()


def _context(targets: Targets | None = None, **env: str) -> ResourceContext:
    trust = {CA_FILE_ENV: str(targets.ca_file)} if targets is not None else {}
    return ResourceContext(environ={**LOOPBACK, **trust, **env})


def _pay(server: LiveServer, body: dict[str, Any], network: str = EVM_NET) -> httpx.Response:
    _, required = quote(server.url + PATH, body)
    assert {a.amount for a in required.accepts} == {str(PRICE)}
    keys = server.devnet.keys
    client = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    return post_paid(server.url + PATH, body, header(sign(client, required, network)))


def _codes(report: dict[str, Any]) -> list[str]:
    return [item["code"] for item in report["diagnosis"]]


def _fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str] | int]) -> list[str]:
    """Stand-in getaddrinfo on the running loop: a name maps to addresses or to a gaierror code.
    Returns the names asked for, to count lookups."""
    asked: list[str] = []
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        asked.append(host)
        answer = answers[host]
        if isinstance(answer, int):
            raise socket.gaierror(answer, "stand-in resolver")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in answer]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    return asked


# --- paid calls on the devnet -------------------------------------------------------------------

def test_paid_call_delivers_the_payload_and_reports_what_came_back(
        gateway: LiveServer, targets: Targets) -> None:
    payload = {"type": "order.created", "data": {"order_id": 42, "note": "naïve ✓"}}
    body = {"url": f"{targets.http_url}/hook", "payload": payload,
            "headers": {"X-Webhook-Token": "s3cret", "X-Attempt": "1"}}
    merchant = gateway.devnet.keys.evm_merchant_address
    before = gateway.devnet.balance(merchant, BASE_SEPOLIA)
    seen = len(targets.received)

    r = _pay(gateway, body)

    assert r.status_code == 200, r.text
    assert gateway.devnet.balance(merchant, BASE_SEPOLIA) - before == PRICE
    rec = receipt(r)
    assert rec["success"] is True and rec["amount"] == str(PRICE)
    [row] = gateway.ledger_rows(tx_hash=rec["transaction"])
    assert row["state"] == "settled" and row["skill_id"] == "webhook-test-payload"

    [got] = targets.received[seen:]
    assert got.method == "POST" and json.loads(got.body) == payload
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["X-Webhook-Token"] == "s3cret" and got.headers["X-Attempt"] == "1"

    report = r.json()
    assert report["ok"] is True and report["status"] == 200 and report["address"] == "127.0.0.1"
    assert report["latency_ms"] > 0 and report["timings"]["total_ms"] == report["latency_ms"]
    assert report["response"]["headers"]["X-Receiver"] == "paywire-test"
    assert report["response"]["body_excerpt"] == '{"received": true}'
    assert _codes(report) == ["ok", "plain_http"]
    assert report["request"]["headers"]["X-Webhook-Token"] == "[redacted]"  # reports are stored
    assert report["request"]["body_bytes"] == len(got.body) and report["request"]["payload"] is None


def test_a_failing_endpoint_is_a_delivered_report_and_is_charged(
        gateway: LiveServer, targets: Targets) -> None:
    merchant = gateway.devnet.keys.sol_merchant_address
    before = gateway.devnet.balance(merchant, SOLANA_DEVNET)
    r = _pay(gateway, {"url": f"{targets.http_url}/fail"}, SOL_NET)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["status"] == 500 and report["ok"] is False and _codes(report)[0] == "non_2xx"
    assert "crashed" in report["response"]["body_excerpt"]
    assert gateway.devnet.balance(merchant, SOLANA_DEVNET) - before == PRICE


def test_allow_list_covers_only_its_networks(gateway: LiveServer) -> None:
    r = httpx.post(gateway.url + PATH, json={"url": "http://10.0.0.1/hook"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "url"
    r = httpx.post(gateway.url + PATH, json={"url": "http://169.254.169.254/"})
    assert r.status_code == 400 and "metadata" in r.json()["error"]["message"]


# --- refusals on a gateway without the allow-list ------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://[fd00:ec2::254]/", "http://100.64.0.1/",
    "http://0.0.0.0/", "http://0x7f.1/", "http://metadata.google.internal/computeMetadata/v1/",
])
def test_forbidden_addresses_are_refused_before_the_quote(server: LiveServer, url: str) -> None:
    r = httpx.post(server.url + PATH, json={"url": url})
    assert r.status_code == 400, r.text
    assert "PAYMENT-REQUIRED" not in r.headers
    assert r.json()["error"]["param"] == "url"


def test_a_name_resolving_to_loopback_is_refused_at_run_time_and_not_charged(
        server: LiveServer, targets: Targets) -> None:
    port = targets.http_url.rsplit(":", 1)[1]
    body = {"url": f"http://localhost:{port}/hook"}
    before = server.devnet.merchant_balances().evm
    seen = len(targets.received)
    r = _pay(server, body)  # a name is quoted: it is resolved when the call runs
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "127.0.0.1" in message and "loopback" in message and "nothing was charged" in message
    assert "PAYMENT-RESPONSE" not in r.headers
    assert server.devnet.merchant_balances().evm == before
    assert len(targets.received) == seen
    rows = [x for x in server.ledger_rows(skill_id="webhook-test-payload") if x["state"] != "settled"]
    assert rows and rows[-1]["state"] == "released"


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"url": "ftp://example.com/hook"}, "url", "http"),
    ({"payload": {"a": 1}}, "url", "url"),
    ({"url": "https://example.com/hook", "payload": {"blob": "x" * (65 * 1024)}}, "payload",
     "at most"),
    ({"url": "https://example.com/hook", "method": "GET"}, "method", "POST"),
    ({"url": "https://example.com/hook", "headers": {"Host": "internal"}}, "headers.Host", "cannot"),
    ({"url": "https://user:pw@example.com/hook"}, "url", "credentials"),
    ({"url": "https://example.com/hook", "timeout_seconds": 30}, "timeout_seconds", "10"),
    ({"url": "https://example.com/hook", "payload": {}, "event": "github.push"}, "event", "not both"),
], ids=["ftp", "no-url", "oversized-payload", "get", "host-header", "credentials", "timeout",
        "payload-and-event"])
def test_bad_input_is_refused_before_the_quote(server: LiveServer, body: dict[str, Any],
                                               param: str, needle: str) -> None:
    r = httpx.post(server.url + PATH, json=body)
    assert r.status_code == 400, r.text
    assert "PAYMENT-REQUIRED" not in r.headers
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"]


# --- diagnoses (the handler run directly, against the loopback targets) -------------------------

async def test_non_2xx_is_diagnosed(targets: Targets) -> None:
    report = await run({"url": f"{targets.http_url}/fail"}, _context())
    assert report["status"] == 500 and report["reason"] == "Internal Server Error"
    assert _codes(report)[0] == "non_2xx" and "server error" in report["diagnosis"][0]["message"]


async def test_a_redirect_is_reported_and_not_followed(targets: Targets) -> None:
    seen = len(targets.received)
    report = await run({"url": f"{targets.http_url}/redirect"}, _context())
    assert report["status"] == 302 and _codes(report)[0] == "redirect"
    assert report["redirect"] == {"location": f"{targets.http_url}/hook"}
    assert len(targets.received) == seen  # /hook was not called


async def test_an_untrusted_certificate_is_a_tls_error(targets: Targets) -> None:
    seen = len(targets.received)
    report = await run({"url": f"{targets.https_url}/hook"}, _context())  # test CA not trusted
    assert report["status"] is None and report["response"] is None
    assert report["error"]["code"] == "tls_error" and report["error"]["phase"] == "connect"
    assert "certificate verification failed" in report["error"]["detail"]
    assert _codes(report) == ["tls_error"] and len(targets.received) == seen


async def test_https_reports_tls_details_even_for_an_empty_answer(targets: Targets) -> None:
    report = await run({"url": f"{targets.https_url}/empty"}, _context(targets))
    assert report["status"] == 204 and _codes(report) == ["ok"]
    tls = report["tls"]
    assert tls["version"].startswith("TLSv1.") and tls["cipher"] and tls["bits"] >= 128
    cert = tls["certificate"]
    assert cert["subject"].startswith(f"CN={LEAF_CN}") and "paywire test CA" in cert["issuer"]
    assert "IP Address:127.0.0.1" in cert["subject_alt_names"] and cert["not_after"]
    assert 0 < cert["days_left"] <= 30


async def test_a_hanging_endpoint_times_out_at_the_callers_limit(targets: Targets) -> None:
    report = await run({"url": f"{targets.http_url}/hang", "timeout_seconds": 0.2}, _context())
    assert report["status"] is None and _codes(report)[0] == "timeout"
    assert report["error"]["phase"] == "response" and "0.2 s" in report["error"]["detail"]
    assert report["latency_ms"] >= 200


async def test_a_refused_connection_is_diagnosed() -> None:
    sock, port = bound_socket()  # bound, not listening: connecting is refused
    try:
        report = await run({"url": f"http://127.0.0.1:{port}/hook"}, _context())
    finally:
        sock.close()
    assert report["error"]["code"] == "connection_error" and report["error"]["phase"] == "connect"


async def test_the_body_read_is_capped(targets: Targets) -> None:
    report = await run({"url": f"{targets.http_url}/big"}, _context())
    response = report["response"]
    assert response["body_bytes_read"] == webhook_test.BODY_READ_CAP and response["body_truncated"]
    assert len(response["body_excerpt"]) == webhook_test.EXCERPT_CHARS


@pytest.mark.parametrize(("event", "check"), [
    ("paywire.test", lambda b, h: b["type"] == "paywire.test" and b["id"].startswith("evt_")),
    ("stripe.payment_intent.succeeded",
     lambda b, h: b["type"] == "payment_intent.succeeded" and b["data"]["object"]["id"].startswith("pi_")),
    ("stripe.checkout.session.completed",
     lambda b, h: b["data"]["object"]["object"] == "checkout.session"),
    ("github.push", lambda b, h: h["X-GitHub-Event"] == "push" and b["ref"] == "refs/heads/main"),
    ("github.ping", lambda b, h: h["X-GitHub-Event"] == "ping" and b["hook_id"] == int(
        h["X-GitHub-Hook-ID"])),
])
async def test_default_events_are_realistic_and_fresh(targets: Targets, event: str, check: Any) -> None:
    seen = len(targets.received)
    reports = [await run({"url": f"{targets.http_url}/hook", "event": event}, _context())
               for _ in range(2)]
    first, second = targets.received[seen:]
    assert check(json.loads(first.body), first.headers)
    assert first.body != second.body  # fresh ids and timestamps each call
    assert reports[0]["request"]["payload"] == json.loads(first.body)
    assert reports[0]["request"]["event"] == event


async def test_put_with_caller_headers(targets: Targets) -> None:
    seen = len(targets.received)
    report = await run({"url": f"{targets.http_url}/hook", "method": "put", "payload": [1, 2],
                        "headers": {"Content-Type": "application/vnd.test+json",
                                    "Authorization": "Bearer t"}}, _context())
    [got] = targets.received[seen:]
    assert got.method == "PUT" and got.body == b"[1,2]"
    assert got.headers["Content-Type"] == "application/vnd.test+json"
    assert got.headers["Authorization"] == "Bearer t"
    assert report["request"]["headers"]["Authorization"] == "[redacted]"


# --- resolution: once, every address checked, the connection pinned -----------------------------

async def test_a_name_is_resolved_once_and_the_connection_pinned_to_the_checked_address(
        targets: Targets, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_dns(monkeypatch, {"hooks.example.com": ["127.0.0.1"]})
    port = targets.http_url.rsplit(":", 1)[1]
    seen = len(targets.received)
    report = await run({"url": f"http://hooks.example.com:{port}/hook"}, _context())
    assert asked == ["hooks.example.com"]
    assert report["status"] == 200 and report["resolved"] == ["127.0.0.1"]
    [got] = targets.received[seen:]
    assert got.headers["Host"] == f"hooks.example.com:{port}"  # the name kept, the address pinned


async def test_tls_is_verified_against_the_name_not_the_pinned_address(
        targets: Targets, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"hooks.example.com": ["127.0.0.1"]})
    port = targets.https_url.rsplit(":", 1)[1]
    report = await run({"url": f"https://hooks.example.com:{port}/hook"}, _context(targets))
    assert report["error"]["code"] == "tls_error"  # the certificate names 127.0.0.1, localhost
    assert "hooks.example.com" in report["error"]["detail"]


@pytest.mark.parametrize("addresses", [["93.184.216.34", "10.0.0.5"], ["::1"],
                                       ["127.0.0.1", "169.254.169.254"]])
async def test_every_resolved_address_is_checked(monkeypatch: pytest.MonkeyPatch,
                                                  addresses: list[str]) -> None:
    _fake_dns(monkeypatch, {"mixed.example.com": addresses})
    with pytest.raises(SkillInputError) as raised:
        await run({"url": "http://mixed.example.com/hook"}, _context())
    assert raised.value.field == "url" and "nothing was charged" in raised.value.message
    assert "mixed.example.com resolves to" in raised.value.message


async def test_a_missing_name_is_reported_and_a_failing_resolver_is_not_charged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"gone.example.com": socket.EAI_NONAME,
                            "flaky.example.com": socket.EAI_AGAIN})
    report = await run({"url": "https://gone.example.com/hook"}, _context())
    assert report["error"] == {"code": "dns_error", "phase": "dns",
                               "detail": "the name gone.example.com does not exist"}
    with pytest.raises(UpstreamError) as raised:
        await run({"url": "https://flaky.example.com/hook"}, _context())
    assert type(raised.value) is UpstreamError  # the pipeline answers 502


# --- validation and settings --------------------------------------------------------------------

@pytest.mark.parametrize(("payload", "field"), [
    ({"url": "https://example.com", "extra": 1}, "extra"),
    ({"url": ""}, "url"),
    ({"url": "javascript:alert(1)"}, "url"),
    ({"url": "https://exa mple.com/"}, "url"),
    ({"url": "https://example.com:0/"}, "url"),
    ({"url": "http://2130706433/"}, "url"),
    ({"url": "http://127.1/"}, "url"),
    ({"url": "http://[fe80::1%25eth0]/"}, "url"),
    ({"url": "http://printer.local/"}, "url"),
    ({"url": "https://example.com/" + "a" * 2048}, "url"),
    ({"url": "https://example.com", "headers": {"Transfer-Encoding": "chunked"}},
     "headers.Transfer-Encoding"),
    ({"url": "https://example.com", "headers": {"Proxy-Authorization": "x"}},
     "headers.Proxy-Authorization"),
    ({"url": "https://example.com", "headers": {"Bad Name": "x"}}, "headers.Bad Name"),
    ({"url": "https://example.com", "headers": {"X-A": "a\r\nX-B: b"}}, "headers.X-A"),
    ({"url": "https://example.com", "headers": {"X-A": "1", "x-a": "2"}}, "headers.x-a"),
    ({"url": "https://example.com", "headers": {f"X-{i}": "v" for i in range(33)}}, "headers"),
    ({"url": "https://example.com", "headers": {"X-A": "v" * 9000}}, "headers"),
    ({"url": "https://example.com", "payload": "text"}, "payload"),
    ({"url": "https://example.com", "event": "stripe.unknown"}, "event"),
    ({"url": "https://example.com", "timeout_seconds": 0}, "timeout_seconds"),
    ({"url": "https://example.com", "timeout_seconds": True}, "timeout_seconds"),
])
def test_validate_names_the_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(SkillInputError) as raised:
        webhook_test.validate(payload, _context())
    assert raised.value.field == field


def test_literal_addresses_are_checked_against_the_allow_list_before_the_quote() -> None:
    webhook_test.validate({"url": "http://127.0.0.1:9/hook"}, _context())
    with pytest.raises(SkillInputError):
        webhook_test.validate({"url": "http://127.0.0.1:9/hook"}, ResourceContext())
    webhook_test.validate({"url": "https://example.com/hook"}, ResourceContext())  # names: at run time


@pytest.mark.parametrize("env", [{ALLOW_ENV: "127.0.0.1/32, not-a-network"},
                                 {CA_FILE_ENV: "/nonexistent/ca.pem"}])
def test_a_misconfigured_gateway_is_unavailable_before_the_quote(env: dict[str, str]) -> None:
    with pytest.raises(SkillUnavailableError) as raised:
        webhook_test.ready(ResourceContext(environ=env))
    assert next(iter(env)) in str(raised.value)


async def test_metadata_stays_refused_even_when_allow_listed() -> None:
    with pytest.raises(SkillInputError) as raised:
        await run({"url": "http://169.254.169.254/latest/"}, _context(**{ALLOW_ENV: "169.254.0.0/16"}))
    assert "metadata" in raised.value.message


def test_the_resource_file_is_valid_and_its_examples_pass() -> None:
    data = json.loads(RESOURCE_FILE.read_text())
    assert check_resource(data) == []
    assert data["kind"] == "python" and data["price"] == "0.062101"
    assert data["categories"] == ["Developer", "General"]
    for example in data["examples"]:
        webhook_test.validate(example, ResourceContext())


def test_diagnosis_flags_slow_answers_expiring_certificates_and_https_upgrades() -> None:
    https = webhook_test.URL("https://hooks.example.com/x")
    slow = Exchange(started=0.0, marks={"done": 2.5}, status=200)
    assert [i["code"] for i in diagnose(slow, https)] == ["ok", "slow"]
    quick = Exchange(started=0.0, marks={"done": 1.9}, status=200)
    assert [i["code"] for i in diagnose(quick, https)] == ["ok"]
    expiring = Exchange(started=0.0, marks={"done": 0.1}, status=204,
                        tls={"certificate": {"days_left": 3}})
    assert [i["code"] for i in diagnose(expiring, https)] == ["ok", "certificate_expiring"]
    moved = Exchange(started=0.0, marks={"done": 0.1}, status=301,
                     location="https://hooks.example.com/x")
    [redirect, plain] = diagnose(moved, webhook_test.URL("http://hooks.example.com/x"))
    assert redirect["code"] == "redirect" and "https" in redirect["message"]
    assert plain["code"] == "plain_http"


# --- net_guard ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("100.64.0.1", "carrier-grade NAT"),
    ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"), ("100.100.100.200", "metadata"),
    ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"), ("255.255.255.255", "reserved"),
    ("240.0.0.1", "reserved"), ("192.0.2.1", "documentation"), ("198.18.0.1", "benchmarking"),
    ("::", "unspecified"), ("::1", "loopback"), ("fe80::1", "link-local"),
    ("fd00:ec2::254", "metadata"), ("fd12:3456::1", "unique local"), ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "metadata"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:a00:1::", "private"), ("::127.0.0.1", "IPv4-compatible"), ("2001:db8::1", "documentation"),
    ("2001::1", "IETF"),
])
def test_forbidden_addresses_say_why(address: str, reason: str) -> None:
    assert reason in (net_guard.forbidden_reason(ip_address(address)) or "")
    with pytest.raises(net_guard.ForbiddenAddress):
        net_guard.check_address(ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::"])
def test_public_addresses_pass(address: str) -> None:
    assert net_guard.forbidden_reason(ip_address(address)) is None
    net_guard.check_address(ip_address(address))


def test_the_allow_list_lifts_the_rules_except_for_metadata() -> None:
    allow = net_guard.parse_networks("127.0.0.1/32, 169.254.0.0/16, fc00::/7")
    net_guard.check_address(ip_address("127.0.0.1"), allow)
    net_guard.check_address(ip_address("::ffff:127.0.0.1"), allow)
    net_guard.check_address(ip_address("169.254.1.1"), allow)
    for refused in ("127.0.0.2", "::1", "169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        with pytest.raises(net_guard.ForbiddenAddress):
            net_guard.check_address(ip_address(refused), allow)


@pytest.mark.parametrize(("host", "refused"), [
    ("metadata.google.internal", True), ("METADATA.Google.Internal.", True), ("metadata", True),
    ("db.internal", True), ("printer.local", True), ("nas.home.arpa", True),
    ("example.com", False), ("localhost", False), ("internal.example.com", False),
])
def test_forbidden_names(host: str, refused: bool) -> None:
    assert (net_guard.forbidden_name_reason(host) is not None) is refused


def test_parse_networks() -> None:
    assert net_guard.parse_networks("") == ()
    assert [str(n) for n in net_guard.parse_networks(" 10.1.2.3/8 ,::1,")] == ["10.0.0.0/8", "::1/128"]
    with pytest.raises(ValueError, match="nope"):
        net_guard.parse_networks("127.0.0.1/32,nope")
