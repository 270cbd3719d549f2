"""a2a-x402 v0.1 and v0.2: a client activating either extension URI (in A2A 1.0's
`A2A-Extensions` header or 0.3's `X-A2A-Extensions`) pays in band end to end, and the answer names
the extension it activated. A v0.1 client gets the quote in x402's v1 form, as v0.1 defines it."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import pytest
from x402.extensions.bazaar import validate_discovery_extension
from x402.schemas import PaymentRequired, PaymentRequiredV1

from agent.a2a.messages import X402_EXTENSION, X402_EXTENSION_V01, X402_EXTENSION_V01_SPEC
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from tests.support.live_server import LiveServer
from tests.support.paying import EVM_NET, SOL_NET, client_for, sign

INPUT = {"text": "Deployed clients speak v0.1 and v0.2.", "model": "gpt-4o"}
PRICE = 5750  # token-count-508


def _send(server: LiveServer, headers: dict[str, str], **message: Any) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "data", "data": {"skill": "token-count-508", "input": INPUT}}], **message}}}
    return httpx.post(f"{server.url}/a2a", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize(("uri", "header", "network"), [
    (X402_EXTENSION, "A2A-Extensions", EVM_NET),
    (X402_EXTENSION_V01, "A2A-Extensions", SOL_NET),
    (X402_EXTENSION_V01, "X-A2A-Extensions", EVM_NET),
    (X402_EXTENSION_V01_SPEC, "A2A-Extensions", EVM_NET),
])
def test_either_version_pays_in_band(server: LiveServer, uri: str, header: str, network: str) -> None:
    devnet, keys = server.devnet, server.devnet.keys
    net, v01 = (BASE_SEPOLIA if network == EVM_NET else SOLANA_DEVNET), uri != X402_EXTENSION
    merchant = keys.evm_merchant_address if network == EVM_NET else keys.sol_merchant_address
    before = devnet.balance(merchant, net)
    ext = {header: uri}

    quoted = _send(server, ext)
    assert quoted.status_code == 200, quoted.text  # in band: no HTTP 402
    assert quoted.headers[header] == uri  # the answer names the extension the client activated
    pending = quoted.json()["result"]
    assert pending["status"]["state"] == "input-required"
    meta = pending["status"]["message"]["metadata"]
    assert meta["x402.payment.status"] == "payment-required"
    required_json = meta["x402.payment.required"]
    required: PaymentRequired | PaymentRequiredV1
    if v01:  # x402's v1 quote: v1 network names, maxAmountRequired
        assert required_json["x402Version"] == 1
        required = PaymentRequiredV1.model_validate(required_json)
        assert {a.network for a in required.accepts} == {"base-sepolia", "solana-devnet"}
        assert all(a.max_amount_required == str(PRICE) for a in required.accepts)
        option = net.v1_name
    else:
        assert required_json["x402Version"] == 2
        required = PaymentRequired.model_validate(required_json)
        assert all(a.amount == str(PRICE) for a in required.accepts)
        option = network
    payer = client_for(server.url, evm_key=keys.evm_payer, sol_key=keys.sol_payer)
    payload = sign(payer, required, option)

    creator = {**ext, "Paywire-Task-Token": pending["metadata"]["paywire.taskToken"]}
    paid = _send(server, creator, taskId=pending["id"], contextId=pending["contextId"],
                 parts=[{"kind": "text", "text": "paid"}],
                 metadata={"x402.payment.status": "payment-submitted",
                           "x402.payment.payload": payload.model_dump(by_alias=True, exclude_none=True)})
    assert paid.status_code == 200, paid.text
    assert paid.headers[header] == uri
    task = paid.json()["result"]
    assert task["status"]["state"] == "completed", task["status"]
    [receipt] = task["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["success"] is True and receipt["network"] == option  # (v1 names it as v1 does)
    assert devnet.balance(merchant, net) - before == PRICE
    [row] = server.ledger_rows(tx_hash=receipt["transaction"])
    assert row["state"] == "settled" and row["amount_atomic"] == PRICE


def test_unknown_extensions_are_not_echoed_and_get_the_http_402(server: LiveServer) -> None:
    """A client naming only extensions paywire does not speak gets the plain x402 HTTP answer;
    one naming both versions gets both back, and the v2 quote."""
    other = _send(server, {"A2A-Extensions": "https://example.com/ext/v9"})
    assert other.status_code == 402 and "A2A-Extensions" not in other.headers
    # the 402 describes the call for x402 indexers: a JSON-RPC send naming the skill
    bazaar = json.loads(base64.b64decode(other.headers["PAYMENT-REQUIRED"]))["extensions"]["bazaar"]
    assert validate_discovery_extension(bazaar).valid
    example = bazaar["info"]["input"]["body"]
    assert example["method"] == "message/send"
    assert example["params"]["message"]["parts"][0]["data"]["skill"] == "token-count-508"
    both = f"{X402_EXTENSION_V01}, {X402_EXTENSION}"
    answered = _send(server, {"A2A-Extensions": f"https://example.com/ext/v9, {both}"})
    assert answered.status_code == 200 and answered.headers["A2A-Extensions"] == both
    required = answered.json()["result"]["status"]["message"]["metadata"]["x402.payment.required"]
    assert required["x402Version"] == 2  # v0.2 spoken: its form wins
