"""What an operator sees: `GET /metrics` after real paid calls on the devnet (REST and A2A, both
chains), refusals, upstream and facilitator trouble counted (the pipeline in process), payments by
ledger state as the ledger has them, request ids in and out, and the paid call's log line (JSON,
without a signature, a payment header or the payload)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import create_async_engine
from x402.schemas import PaymentRequired

from agent.observability.metrics import Metrics, Observer
from agent.observability.request_log import JsonFormatter
from agent.pipeline.outcomes import Delivered, PaymentDemanded, Refused
from payments.codec import decode_base64_any
from payments.devnet.keys import DevnetKeys
from payments.ledger import Ledger
from skills.errors import UpstreamError
from skills.skill import Payload, SkillResult
from tests.pipeline.harness import MODEL, build_pipeline, make_skill
from tests.support.fake_upstream import FakeStream, chat_answer, chat_chunks
from tests.support.live_server import LiveServer, start_server
from tests.support.operator_ledger import CHANNEL_TOKEN, write_channels
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, quote, receipt, sign
from tests.support.scripted_facilitator import (
    INSUFFICIENT_BALANCE,
    BroadcastThenTimeout,
    Invalid,
    Raises,
    SettleFails,
)
from tests.support.served_process import free_port, paywire_env, start_paywire, stop

TOKEN = "scrape-token-0123456789"
RESOURCE = "/v1/marketplace/api/token-count-508"
ROUTE = "/v1/marketplace/api/{resource_id:path}"
SKILL = "token-count-508"
MARKER = "MARKER-payload-7f3a"  # placed in every payload: must never reach a log line
PRICE = 5750
GENERATED_ID = re.compile(r"[0-9a-f]{32}")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by (name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape(server: LiveServer) -> Samples:
    r = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def body(text: str = "") -> dict[str, Any]:
    return {"text": f"{MARKER} {text}", "model": "gpt-4o"}


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("watched"), env={"PAYWIRE_METRICS_TOKEN": TOKEN})
    yield live
    live.stop()


def _ledger_by_state(server: LiveServer) -> dict[str, tuple[int, int]]:
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in server.ledger_rows():
        found[row["state"]][0] += 1
        found[row["state"]][1] += row["amount_atomic"]
    return {state: (n, total) for state, (n, total) in found.items()}


def test_paid_calls_on_rest_and_a2a_show_in_metrics_and_in_one_log_line_each(
        watched: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    keys = watched.devnet.keys
    payer = client_for(watched.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    url = watched.url + RESOURCE
    before = scrape(watched)

    signatures, headers, prices = [], [], []
    paid: dict[str, httpx.Response] = {}
    for network, rid in ((EVM_NET, "rest-evm-1"), (SOL_NET, "rest-sol-1")):
        _, required = quote(url, body(network))
        prices.append(int(next(a.amount for a in required.accepts if a.network == network)))
        signed = sign(payer, required, network)
        signatures.append(signed.payload.get("signature") or signed.payload.get("transaction"))
        headers.append(header(signed))
        paid[rid] = httpx.post(url, json=body(network), timeout=60,
                               headers={"PAYMENT-SIGNATURE": headers[-1], "X-Request-Id": rid})
        assert paid[rid].status_code == 200, paid[rid].text
        assert paid[rid].headers["x-request-id"] == rid

    # A2A: the plain x402 way (HTTP 402, then the same request with the payment header).
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "m-1",
        "parts": [{"kind": "data", "data": {"skill": SKILL, "input": body("a2a")}}]}}}
    unpaid = httpx.post(f"{watched.url}/a2a", json=rpc, timeout=60)
    assert unpaid.status_code == 402 and GENERATED_ID.fullmatch(unpaid.headers["x-request-id"])
    required = PaymentRequired.model_validate(
        json.loads(decode_base64_any(unpaid.headers["PAYMENT-REQUIRED"])))
    prices.append(int(required.accepts[0].amount))
    signed = sign(payer, required, EVM_NET)
    signatures.append(signed.payload["signature"])
    headers.append(header(signed))
    a2a = httpx.post(f"{watched.url}/a2a", json=rpc, timeout=60,
                     headers={"PAYMENT-SIGNATURE": headers[-1], "X-Request-Id": "a2a-paid-1"})
    assert a2a.status_code == 200 and a2a.json()["result"]["status"]["state"] == "completed", a2a.text
    assert a2a.headers["x-request-id"] == "a2a-paid-1"

    # The REST EVM payment again, for another request: refused, nothing charged.
    refused = httpx.post(url, json=body("another"), timeout=60,
                         headers={"PAYMENT-SIGNATURE": headers[0], "X-Request-Id": "reused-1"})
    assert refused.status_code == 402 and refused.json()["reason"] == "payment_already_used"

    after = scrape(watched)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    calls = "paywire_calls_total"
    assert delta(calls, skill=SKILL, network=EVM_NET, outcome="settled") == 2
    assert delta(calls, skill=SKILL, network=SOL_NET, outcome="settled") == 1
    assert delta(calls, skill=SKILL, outcome="quoted") == 3  # two REST quotes, the A2A 402
    assert delta(calls, skill=SKILL, network=EVM_NET, outcome="payment_refused") == 1
    assert delta(calls) == 7
    # Revenue: exactly the quoted prices, in atomic units (and the same in USD, as a float).
    assert prices == [PRICE] * 3
    assert delta("paywire_revenue_atomic_total", skill=SKILL) == sum(prices)
    assert delta("paywire_revenue_atomic_total", network=EVM_NET) == 2 * PRICE
    assert delta("paywire_revenue_usd_total") == pytest.approx(float(Decimal(sum(prices)) / 10**6))
    # Stage histograms: every stage of every call observed once.
    count = "paywire_stage_seconds_count"
    assert delta(count, stage="settle") == 3 and delta(count, stage="record") == 3
    assert delta(count, stage="verify") == 4 and delta(count, stage="quote") == 7
    assert delta(count, stage="total") == 7
    assert delta("paywire_stage_seconds_bucket", stage="settle", le="+Inf") == 3
    assert delta("paywire_stage_seconds_sum", stage="settle") > 0
    # Requests by route template and status, never the raw path.
    requests = "paywire_http_requests_total"
    assert delta(requests, route=ROUTE, status="200") == 2
    assert delta(requests, route=ROUTE, status="402") == 3
    assert delta(requests, route="/a2a", status="402") == 1
    assert delta(requests, route="/a2a", status="200") == 1
    assert not any("token-count-508" in dict(labels).get("route", "") for _, labels in after)
    # Payments by ledger state: what the ledger holds now.
    assert value(after, "paywire_ledger_up") == 1
    ledger = _ledger_by_state(watched)
    assert ledger["settled"][0] >= 3
    for state, (n, total) in ledger.items():
        assert value(after, "paywire_payments", state=state) == n
        assert value(after, "paywire_payments_atomic", state=state) == total
    assert value(after, "paywire_build_info") == 1

    # One line per paid call, JSON, with the call's public facts.
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records if r.name == "paywire.calls"]
    by_id = {line["request_id"]: line for line in lines}
    assert set(by_id) == {"rest-evm-1", "rest-sol-1", "a2a-paid-1", "reused-1"}
    evm = by_id["rest-evm-1"]
    assert evm["logger"] == "paywire.calls" and evm["level"] == "INFO"
    assert (evm["skill"], evm["network"], evm["outcome"], evm["status"]) == (SKILL, EVM_NET, "settled", 200)
    assert (evm["amount_atomic"], evm["amount_usd"]) == (PRICE, "0.00575")
    assert evm["tx_hash"] == receipt(paid["rest-evm-1"])["transaction"]
    assert evm["payer"] == keys.evm_payer_address and evm["ledger_state"] == "settled"
    assert evm["latency_ms"] > 0 and evm["operation"] is None
    assert by_id["rest-sol-1"]["network"] == SOL_NET
    assert by_id["rest-sol-1"]["payer"] == keys.sol_payer_address
    # The A2A call ran in the SDK's own task: the request's id still reached its line.
    assert by_id["a2a-paid-1"]["outcome"] == "settled" and by_id["a2a-paid-1"]["tx_hash"]
    reused = by_id["reused-1"]
    assert (reused["outcome"], reused["status"], reused["tx_hash"]) == ("payment_refused", 402, None)
    # Nothing secret in any line paywire or its libraries logged meanwhile, JSON or text.
    everything = "\n".join([formatter.format(r) for r in caplog.records]
                           + [logging.Formatter().format(r) for r in caplog.records])
    for secret in [*signatures, *headers, MARKER]:
        assert secret not in everything


def test_request_ids_are_taken_when_sane_replaced_when_junk_made_when_absent(
        watched: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}
    sane = "req_01.ABC:xyz-9"
    http = httpx.Client(timeout=30)
    for method, path, kwargs in (("POST", RESOURCE, {"json": body()}), ("GET", "/health", {}),
                                 ("POST", "/a2a", {"json": rpc}), ("GET", "/no/such/route", {})):
        def send(rid: str | None, method: str = method, path: str = path,
                 kwargs: dict[str, Any] = kwargs) -> str:
            headers = {"X-Request-Id": rid} if rid is not None else {}
            return http.request(method, watched.url + path, headers=headers, **kwargs
                                ).headers["x-request-id"]

        assert send(sane) == sane
        assert send("x" * 128) == "x" * 128
        for junk in ("x" * 129, "two words", "a\tb", "<script>", "id;drop", ""):
            replaced = send(junk)
            assert replaced != junk and GENERATED_ID.fullmatch(replaced), (path, junk)
        first, second = send(None), send(None)
        assert GENERATED_ID.fullmatch(first) and first != second
    http.close()

    # A bug's 500 is answered outside the middleware: it carries the id all the same.
    async def broken(req: Any) -> Any:
        raise RuntimeError("bug")

    before = scrape(watched)
    monkeypatch.setattr(watched.runtime.gateway, "call", broken)
    r = httpx.post(watched.url + RESOURCE, json=body(), headers={"X-Request-Id": "bug-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "bug-1"
    after = scrape(watched)
    assert (value(after, "paywire_http_requests_total", route=ROUTE, status="500")
            - value(before, "paywire_http_requests_total", route=ROUTE, status="500")) == 1
    assert value(after, "paywire_http_requests_total", route="unmatched", status="404") >= 1


def test_metrics_need_the_token_when_one_is_set(watched: LiveServer) -> None:
    for given in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                  {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}):
        r = httpx.get(f"{watched.url}/metrics", headers=given)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "PAYWIRE_METRICS_TOKEN" in r.json()["error"]["message"] and "paywire_" not in r.text
    openmetrics = httpx.get(f"{watched.url}/metrics", headers={
        "Authorization": f"Bearer {TOKEN}", "Accept": "application/openmetrics-text; version=1.0.0"})
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")


def test_each_replica_exposes_its_own_counters_and_the_shared_ledger(
        watched: LiveServer, tmp_path: Path) -> None:
    """A second replica on the same database: its counters are its own (a registry per app),
    the payments by state are the shared ledger's; a third with PAYWIRE_METRICS=false serves no
    /metrics but still answers with request ids."""
    watched_before = scrape(watched)
    replica = start_server(tmp_path / "b", database_url=watched.runtime.settings.db_url,
                           env={"PAYWIRE_METRICS_TOKEN": TOKEN})
    silent = start_server(tmp_path / "c", env={"PAYWIRE_METRICS": "false"})
    try:
        quote(replica.url + RESOURCE, body())
        mine, theirs = scrape(replica), scrape(watched)
        assert value(mine, "paywire_calls_total", outcome="quoted") == 1
        assert value(mine, "paywire_calls_total", outcome="settled") == 0
        assert value(theirs, "paywire_calls_total") == value(watched_before, "paywire_calls_total")
        for state in _ledger_by_state(watched):
            assert value(mine, "paywire_payments", state=state) == value(
                theirs, "paywire_payments", state=state)
        r = httpx.get(f"{silent.url}/metrics")
        assert r.status_code == 404 and GENERATED_ID.fullmatch(r.headers["x-request-id"])
    finally:
        replica.stop()
        silent.stop()


async def _failing(payload: Payload) -> SkillResult:
    raise UpstreamError("the provider answered 503")


async def test_refusals_upstream_errors_and_facilitator_trouble_are_counted(tmp_path: Path) -> None:
    """The pipeline in process (a scripted facilitator, a fake model upstream, a real SQLite
    ledger), observed as the app observes it."""
    pipeline, engine = await build_pipeline(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    metrics = Metrics("test")
    gateway = pipeline.gateway
    gateway.observer = Observer(metrics, pipeline.registry, gateway.processor.networks)
    pipeline.add(make_skill("flaky", _failing))
    fac = pipeline.facilitator
    try:
        payload = {"q": MARKER}
        flaky = await pipeline.call("flaky", payload, await pipeline.pay("flaky", payload))
        assert isinstance(flaky, Refused) and flaky.code == "upstream_error"
        fac.script_verify(Raises(ConnectionError("facilitator down")))
        down = await pipeline.call("echo", {"n": 1}, await pipeline.pay("echo", {"n": 1}))
        assert isinstance(down, Refused) and down.code == "facilitator_unavailable"
        fac.script_verify(Invalid(INSUFFICIENT_BALANCE))
        poor = await pipeline.call("echo", {"n": 2}, await pipeline.pay("echo", {"n": 2}))
        assert isinstance(poor, PaymentDemanded) and poor.receipt is None
        fac.script_settle(SettleFails(INSUFFICIENT_BALANCE))
        failed = await pipeline.call("echo", {"n": 3}, await pipeline.pay("echo", {"n": 3}))
        assert isinstance(failed, PaymentDemanded) and failed.receipt is not None
        fac.script_settle(BroadcastThenTimeout())
        pending = await pipeline.call("echo", {"n": 4}, await pipeline.pay("echo", {"n": 4}))
        assert isinstance(pending, Refused) and pending.code == "settlement_pending"
        settled = await pipeline.call("echo", {"n": 5}, echo_payment := await pipeline.pay("echo", {"n": 5}))
        assert isinstance(settled, Delivered)
        again = await pipeline.call("echo", {"n": 5}, echo_payment)  # the kept result: no revenue
        assert isinstance(again, Delivered) and again.receipt is not None
        # A model: its upstream cost; a stream, counted once when it settled (before its first byte).
        chat = {"model": MODEL, "messages": [{"role": "user", "content": MARKER}], "max_tokens": 8}
        pipeline.upstream.reply("/chat/completions", chat_answer("hi"))
        answered = await pipeline.call(MODEL, chat, await pipeline.pay(MODEL, chat))
        assert isinstance(answered, Delivered) and answered.result.upstream_cost_usd
        streamed = {**chat, "stream": True}
        pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("a", "b")))
        stream = await pipeline.call(MODEL, streamed, await pipeline.pay(MODEL, streamed), stream=True)
        assert isinstance(stream, Delivered) and stream.stream is not None
        counted = parse((await metrics.exposition(pipeline.ledger, None))[0].decode())
        assert [chunk async for chunk in stream.stream]
        await pipeline.bookkeeping_done()

        text, _ = await metrics.exposition(pipeline.ledger, "text/plain")
        samples = parse(text.decode())
        calls = "paywire_calls_total"
        assert value(samples, calls) == value(counted, calls)  # reading the stream counts nothing
        assert value(samples, calls, skill="flaky", network=EVM_NET, outcome="upstream_error") == 1
        assert value(samples, "paywire_upstream_errors_total", skill="flaky", code="upstream_error") == 1
        for outcome in ("facilitator_unavailable", "payment_refused", "settlement_failed",
                        "settlement_pending", "redelivered"):
            assert value(samples, calls, skill="echo", network=EVM_NET, outcome=outcome) == 1, outcome
        assert value(samples, calls, skill="echo", network=EVM_NET, outcome="settled") == 1
        assert value(samples, calls, skill=MODEL, network=EVM_NET, outcome="settled") == 2
        assert value(samples, calls, outcome="quoted") == 8  # one quote per payment signed
        facilitator = "paywire_facilitator_errors_total"
        for code in ("facilitator_unavailable", "settlement_failed", "settlement_pending"):
            assert value(samples, facilitator, network=EVM_NET, code=code) == 1, code
        echo_price = int((await pipeline.signed("echo", {"n": 6}))["accepted"]["amount"])
        model_prices = answered.price_atomic + stream.price_atomic
        assert value(samples, "paywire_revenue_atomic_total", skill="echo") == echo_price
        assert value(samples, "paywire_revenue_atomic_total", skill=MODEL) == model_prices
        cost = answered.result.upstream_cost_usd
        assert value(samples, "paywire_upstream_cost_usd_total", skill=MODEL) == pytest.approx(float(cost))
        assert value(samples, "paywire_upstream_cost_atomic_total", skill=MODEL) >= 1
        ledger = await pipeline.ledger.counts()
        assert ledger and value(samples, "paywire_ledger_up") == 1
        for state, (n, total) in ledger.items():
            assert value(samples, "paywire_payments", state=state) == n
            assert value(samples, "paywire_payments_atomic", state=state) == total
        assert value(samples, "paywire_payments", state="pending") == 1

        # The ledger down: the scrape still answers, and says so.
        unreachable = Ledger(create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'gone' / 'x.db'}"))
        down_text, _ = await metrics.exposition(unreachable, None)
        down_samples = parse(down_text.decode())
        assert value(down_samples, "paywire_ledger_up") == 0
        assert not any(name.startswith("paywire_payments") for name, _ in down_samples)
        assert value(down_samples, calls) == value(samples, calls) + 1  # (+ the quote for echo_price)
        unreachable.close()
        await unreachable.engine.dispose()
    finally:
        pipeline.ledger.close()
        await engine.dispose()


def test_paywire_serve_writes_json_lines_with_request_ids(tmp_path: Path) -> None:
    """`paywire serve` with PAYWIRE_LOG_FORMAT=json: uvicorn's access lines and the paid call's
    line are JSON objects carrying the request id; the devnet banner is the only other text."""
    port, log = free_port(), tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = start_paywire(port, paywire_env(tmp_path / "data", PAYWIRE_LOG_FORMAT="json"),
                             stderr=stderr, stdout=subprocess.DEVNULL, log_level="info")
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health", headers={"X-Request-Id": "proc-health"}).status_code == 200
        keys = DevnetKeys(**json.loads((tmp_path / "data" / "devnet-keys.json").read_text()))
        _, required = quote(base + RESOURCE, body())
        signed = sign(client_for(base, evm_key=keys.evm_payer), required, EVM_NET)
        r = httpx.post(base + RESOURCE, json=body(), timeout=60,
                       headers={"PAYMENT-SIGNATURE": header(signed), "X-Request-Id": "proc-paid"})
        assert r.status_code == 200, r.text
    finally:
        stop(proc)
    text = log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    access = [x for x in lines if x["logger"] == "uvicorn.access" and x.get("request_id") == "proc-health"]
    assert access and access[0]["path"] == "/health" and access[0]["status"] == 200
    [call] = [x for x in lines if x["logger"] == "paywire.calls"]
    assert call["request_id"] == "proc-paid" and call["outcome"] == "settled"
    assert call["payer"] == Account.from_key(keys.evm_payer).address
    assert call["tx_hash"] == receipt(r)["transaction"]
    assert any(x["logger"] == "uvicorn.error" for x in lines)  # uvicorn's own lines too
    assert MARKER not in text and signed.payload["signature"] not in text and header(signed) not in text



async def test_channels_show_by_state_with_their_balances_unclaimed_charges_and_next_claim(
        tmp_path: Path) -> None:
    """Channels written as the gateway writes them (tests/support/operator_ledger.py: deposits,
    voucher calls, a claim, a withdrawal), read from the ledger at the scrape."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    engine = create_async_engine(url)
    ledger = Ledger(engine)
    try:
        await ledger.create_tables()
        before = time.time()
        written = await write_channels(url)
        after = time.time()
        samples = parse((await Metrics("test").exposition(ledger, None))[0].decode())
        assert value(samples, "paywire_ledger_up") == 1
        by_state = {state: value(samples, "paywire_channels", network=EVM_NET, state=state)
                    for state in ("open", "closing", "quarantined", "closed")}
        assert by_state == {"open": 1, "closing": 1, "quarantined": 0, "closed": 1}
        labels = {"network": EVM_NET, "token": CHANNEL_TOKEN}
        assert [value(samples, f"paywire_channel_{name}_atomic", **labels)
                for name in ("balance", "unclaimed", "escrow")] == [
            written.balance, written.unclaimed, written.escrow] == [1_050_000, 23_000, 1_021_250]
        # the withdrawal made its channel due at once (x402 #3464): the next claim is then
        due = value(samples, "paywire_channel_next_claim_timestamp_seconds", **labels)
        assert before <= due <= after
        assert len([key for key in samples if key[0].startswith("paywire_channel")]) == 4 + 4
    finally:
        ledger.close()
        await engine.dispose()
