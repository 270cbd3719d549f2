"""`upto` on EVM through the gateway (issue 23 §3), as a client sees it: a real gateway (uvicorn on
loopback, the py-evm devnet with Permit2 and the upto proxy at their canonical addresses), a real
OpenAI-compatible upstream on loopback, and the x402 SDK's own unchanged upto client signing the
quote's maximum through Permit2.

- A chat call priced from its request is offered `upto` beside `exact`, at the same maximum; a
  fixed-price resource is offered `exact` only.
- Paid with upto, the call settles what it used (the usage the upstream reported, priced by the
  model table), not its maximum: the payer's balance and the merchant's move by exactly that, in
  one transaction, and the ledger records the charge with the authorized maximum.
- A stream settles at its end, for its usage.
- A call that fails settles nothing: the payer's balance does not move.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from payments.codec import decode_base64_any
from tests.support.live_server import LiveServer
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, sign
from tests.support.polling import until
from tests.support.upto import (
    BODY,
    FUNDS,
    MODEL,
    Served,
    approved_payer,
    ledger_row,
    quote,
    settled_row,
    upto_gateway,
    upto_payment,
    usage_price,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with upto_gateway(tmp_path_factory.mktemp("upto")) as served:
        yield served


@pytest.fixture(scope="module")
def upstream(served: Served) -> OpenAIUpstream:
    return served.upstream


@pytest.fixture(scope="module")
def gateway(served: Served) -> LiveServer:
    return served.gateway


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: OpenAIUpstream) -> None:
    upstream.reset()


def test_a_call_priced_from_its_request_is_offered_upto_beside_exact(gateway: LiveServer) -> None:
    required = quote(gateway, "/v1/chat/completions", BODY)
    offered = {(o.scheme, o.network): int(o.amount) for o in required.accepts}
    assert offered[("upto", EVM_NET)] == offered[("exact", EVM_NET)] > 0
    upto = next(o for o in required.accepts if o.scheme == "upto")
    assert upto.extra["assetTransferMethod"] == "permit2"
    assert upto.extra["facilitatorAddress"] == gateway.devnet.evm.facilitator_signer().address
    fixed = quote(gateway, "/v1/marketplace/api/token-count-508",
                  {"text": "a fixed price", "model": "gpt-4o"})
    assert {o.scheme for o in fixed.accepts} == {"exact", "batch-settlement"}  # never upto


def test_upto_settles_what_the_call_used_not_its_maximum(gateway: LiveServer,
                                                          upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", BODY))
    merchant = gateway.devnet.merchant_balances().evm
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code == 200, answer.text  # the first answer
    charged = usage_price(13, 2)
    assert charged < maximum // 100  # the one-word answer costs the floor, not the 4,096-token cap
    receipt = json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] and receipt["transaction"] and receipt["amount"] == str(charged)
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert gateway.devnet.merchant_balances().evm - merchant == charged
    row = ledger_row(gateway, payer.address)
    assert (row["state"], row["scheme"], row["amount_atomic"], row["charged_atomic"]) == (
        "settled", "upto", maximum, charged)


def test_an_upto_stream_settles_its_usage_at_its_end(gateway: LiveServer,
                                                      upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 40}
    body = {**BODY, "stream": True}
    payment, maximum = upto_payment(payer, quote(gateway, "/v1/chat/completions", body))
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                      headers={"PAYMENT-SIGNATURE": payment}, timeout=60) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    charged = usage_price(13, 40)
    assert 0 < charged < maximum
    # the stream's end record is written once its last event is sent: the caller may read first
    row = until(lambda: settled_row(gateway, payer.address), "the stream's end recorded")
    assert (row["state"], row["charged_atomic"]) == ("settled", charged) and row["tx_hash"]
    assert chain.balance_of(payer.address) == FUNDS - charged
    assert row["usage"]["completion_tokens"] == 40  # the stream's usage, kept by the settlement


def test_a_failed_upto_call_settles_nothing(gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    chain = gateway.devnet.evm
    payer = approved_payer(chain)
    payment, _ = upto_payment(payer, quote(gateway, "/v1/chat/completions", BODY))
    upstream.behaviour.fail(400)  # the provider refuses the request: nothing delivered
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code >= 400 and "PAYMENT-RESPONSE" not in answer.headers
    assert chain.balance_of(payer.address) == FUNDS
    assert ledger_row(gateway, payer.address)["state"] == "released"


def test_an_exact_solana_call_is_charged_its_usage_and_owed_the_rest(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    """Solana has no upto: the exact payment moves the maximum, the call is charged its usage, and
    the receipt says the rest is owed back (payments/refunds.py sends it in the next batch)."""
    upstream.behaviour.reported_usage = {"prompt_tokens": 13, "completion_tokens": 2}
    required = quote(gateway, "/v1/chat/completions", BODY)
    client = client_for(gateway.url, sol_key=gateway.devnet.keys.sol_payer)
    payment = header(sign(client, required, SOL_NET))
    paid = next(int(o.amount) for o in required.accepts if o.network == SOL_NET)
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY,
                        headers={"PAYMENT-SIGNATURE": payment}, timeout=60)
    assert answer.status_code == 200, answer.text
    charged = usage_price(13, 2)
    receipt = json.loads(decode_base64_any(answer.headers["PAYMENT-RESPONSE"]))
    assert receipt["amount"] == str(paid)  # what moved
    refund = receipt["extra"]["refund"]
    assert (refund["status"], int(refund["amount_atomic"])) == ("owed", paid - charged)
    [row] = [r for r in gateway.ledger_rows(skill_id=MODEL) if r["network"] == SOL_NET]
    assert (row["state"], row["amount_atomic"], row["charged_atomic"]) == ("settled", paid, charged)
