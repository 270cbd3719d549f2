"""Limiting abuse outside the pipeline tier: the rate limit's bounded memory and client keys, the
local refusal of Solana payments (transactions built and signed here, no chain), the payer a
signature proves, and a real server behind a trusted proxy answering 429 with Retry-After per
real client (REST and A2A), while a direct client cannot pose as another with X-Forwarded-For."""

from __future__ import annotations

import base64
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from eth_account import Account
from solders.compute_budget import set_compute_unit_limit, set_compute_unit_price
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import VersionedTransaction
from x402.mechanisms.svm.constants import TOKEN_PROGRAM_ADDRESS
from x402.mechanisms.svm.utils import derive_ata
from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo

from agent.a2a.messages import X402_EXTENSION
from agent.app import create_app
from agent.serving import uvicorn_config
from agent.settings import Settings
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.precheck import local_refusal, proven_payer
from payments.rate_limits import RateLimit, client_key
from tests.support.paying import client_for

# ---- the limit itself --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_limit_allows_its_burst_then_one_per_interval() -> None:
    clock = Clock()
    limit = RateLimit(per_minute=30, burst=3, clock=clock)  # one every 2 s
    assert [limit.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.take("a") == pytest.approx(2.0)  # counted nothing
    assert limit.take("b") == 0.0
    clock.now += 2
    assert limit.take("a") == 0.0 and limit.take("a") == pytest.approx(2.0)
    limit.give_back("a")
    assert limit.take("a") == 0.0
    clock.now += 60  # fully recovered: the key is forgotten when next looked at
    assert limit.wait("a") == 0.0 and "a" not in limit._due


def test_the_keys_a_limit_tracks_are_bounded_least_recent_first() -> None:
    limit = RateLimit(per_minute=1, burst=1, max_keys=100, clock=Clock())
    for n in range(10_000):  # an attacker rotating addresses
        limit.hit(f"10.0.{n // 256}.{n % 256}")
    assert len(limit) == 100
    assert limit.wait("10.0.39.15") > 0  # the latest are remembered (10,000th: 39 * 256 + 15)
    assert limit.wait("10.0.0.0") == 0.0  # the oldest forgotten: as a fresh address would be


def test_client_keys_group_an_ipv6_subscriber_by_its_64() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_key("192.0.2.1") == "192.0.2.1"
    assert len(client_key("x" * 10_000)) == 100


# ---- what a Solana payment proves without the chain -------------------------------------------

MINT = SOLANA_DEVNET.usdc
MERCHANT = str(Keypair().pubkey())
FEE_PAYER = Keypair().pubkey()
PRICE = 10_000


def sol_requirement() -> PaymentRequirements:
    return PaymentRequirements(scheme="exact", network=SOLANA_DEVNET.caip2, asset=MINT, amount=str(PRICE),
                               pay_to=MERCHANT, max_timeout_seconds=300,
                               extra={"feePayer": str(FEE_PAYER)})


def sol_payment(owner: Keypair, *, amount: int = PRICE, mint: str = MINT, to: str = MERCHANT,
                signer: Keypair | None = None) -> dict[str, Any]:
    """An x402 `exact` Solana payload as the SDK's client builds it: compute budget, then
    TransferChecked signed by the token owner; the fee payer's slot left for the facilitator."""
    token = Pubkey.from_string(TOKEN_PROGRAM_ADDRESS)
    transfer = Instruction(token, bytes([12]) + amount.to_bytes(8, "little") + bytes([6]), [
        AccountMeta(Pubkey.from_string(derive_ata(str(owner.pubkey()), mint)), False, True),
        AccountMeta(Pubkey.from_string(mint), False, False),
        AccountMeta(Pubkey.from_string(derive_ata(to, mint)), False, True),
        AccountMeta(owner.pubkey(), True, False)])
    message = MessageV0.try_compile(FEE_PAYER, [set_compute_unit_limit(20_000),
                                                set_compute_unit_price(1), transfer], [],
                                    Hash.new_unique())
    signature = (signer or owner).sign_message(to_bytes_versioned(message))
    tx = VersionedTransaction.populate(message, [Signature.default(), signature])
    return {"transaction": base64.b64encode(bytes(tx)).decode()}


def test_a_good_solana_payment_passes_and_proves_its_payer() -> None:
    owner = Keypair()
    payload = sol_payment(owner)
    assert local_refusal(payload, sol_requirement()) is None
    assert local_refusal(sol_payment(owner, amount=PRICE + 1), sol_requirement()) is None  # as the SDK
    assert proven_payer(payload, sol_requirement()) == str(owner.pubkey())


@pytest.mark.parametrize(("case", "changes", "reason"), [
    ("less than the quote", {"amount": PRICE - 1}, "invalid_exact_svm_payload_amount_insufficient"),
    ("another mint", {"mint": str(Keypair().pubkey())}, "invalid_exact_svm_payload_mint_mismatch"),
    ("another recipient", {"to": str(Keypair().pubkey())},
     "invalid_exact_svm_payload_recipient_mismatch"),
    ("signed by another key", {"signer": Keypair()}, "transaction_simulation_failed"),
], ids=["amount", "mint", "recipient", "signature"])
def test_provably_invalid_solana_payments_are_refused_locally(case: str, changes: dict[str, Any],
                                                              reason: str) -> None:
    owner = Keypair()
    payload = sol_payment(owner, **changes)
    refused = local_refusal(payload, sol_requirement())
    assert refused is not None and not refused.is_valid and refused.invalid_reason == reason
    assert refused.payer == str(owner.pubkey()) and refused.invalid_message
    if case == "signed by another key":
        assert proven_payer(payload, sol_requirement()) is None


def test_an_evm_signature_proves_its_payer_only_when_it_recovers_to_from() -> None:
    key = Account.create()
    requirement = PaymentRequirements(scheme="exact", network=BASE_SEPOLIA.caip2,
                                      asset=BASE_SEPOLIA.usdc, amount="5750",
                                      pay_to=Account.create().address, max_timeout_seconds=300,
                                      extra={"name": "USDC", "version": "2"})
    required = PaymentRequired(x402_version=2, resource=ResourceInfo(url="https://paywire.test/x"),
                               accepts=[requirement])
    signed = client_for("http://unused.invalid", evm_key=key.key.hex()).create_payment_payload(required)
    payload = signed.model_dump(by_alias=True, exclude_none=True)["payload"]
    assert local_refusal(payload, requirement) is None
    assert proven_payer(payload, requirement) == key.address.lower()
    forged = {**payload, "authorization": {**payload["authorization"],
                                           "from": Account.create().address}}
    assert proven_payer(forged, requirement) is None  # (a smart wallet's: not proven either)
    assert local_refusal(forged, requirement) is None  # but not refusable without the chain


# ---- a real server behind a trusted proxy ----------------------------------------------------

TOKEN_COUNT = "/v1/marketplace/api/token-count-508"
BODY = {"text": "The quick brown fox", "model": "gpt-4o"}


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`paywire serve`'s uvicorn configuration, the proxy at 127.0.0.1 trusted; 2 quotes and
    1 refused payment at once per client."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings.from_env({
        "PAYWIRE_DATA_DIR": str(tmp_path_factory.mktemp("proxied")), "PAYWIRE_PORT": str(port),
        "PAYWIRE_RATE_QUOTES_PER_MINUTE": "1", "PAYWIRE_RATE_QUOTES_BURST": "2",
        "PAYWIRE_RATE_PAYMENTS_PER_MINUTE": "1", "PAYWIRE_RATE_PAYMENTS_BURST": "1",
        "PAYWIRE_TRUSTED_PROXIES": "127.0.0.1"})
    server = uvicorn.Server(uvicorn_config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", trusted_proxies=settings.trusted_proxies))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)  # polling a flag with a deadline
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


def through_proxy(url: str, path: str, client: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url + path, headers={"X-Forwarded-For": client, **kwargs.pop("headers", {})},
                      timeout=30, **kwargs)


def assert_429(r: httpx.Response, setting: str) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 1
    error = r.json()["error"]
    if "jsonrpc" in r.json():  # /a2a: a JSON-RPC server error whose data names paywire's code
        assert error["code"] == -32000
        error = {**error, "code": error["data"]["code"]}
    assert error["code"] == "rate_limited" and setting in error["message"]


def test_quotes_are_limited_per_real_client_on_rest_and_a2a(proxied: str) -> None:
    for _ in range(2):
        assert through_proxy(proxied, TOKEN_COUNT, "203.0.113.1", json=BODY).status_code == 402
    r = through_proxy(proxied, TOKEN_COUNT, "203.0.113.1", json=BODY)
    assert_429(r, "PAYWIRE_RATE_QUOTES_PER_MINUTE")
    assert r.json()["success"] is False and "PAYMENT-REQUIRED" not in r.headers
    assert 59 <= int(r.headers["Retry-After"]) <= 60  # one a minute
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "data", "data": {"skill": "token-count-508", "input": BODY}}]}}}
    assert_429(through_proxy(proxied, "/a2a", "203.0.113.1", json=rpc), "PAYWIRE_RATE_QUOTES_BURST")
    # in band (the a2a-x402 extension): the executor's quote is counted for the same real client
    in_band = {"A2A-Extensions": X402_EXTENSION}
    states = [through_proxy(proxied, "/a2a", "203.0.113.3", json=rpc, headers=in_band).json()["result"]
              for _ in range(3)]
    assert [s["status"]["state"] for s in states] == ["input-required", "input-required", "failed"]
    error = states[2]["status"]["message"]["metadata"]["paywire.error"]
    assert (error["status"], error["code"]) == (429, "rate_limited") and error["retry_after"] >= 1
    # another client behind the same proxy is not affected
    assert through_proxy(proxied, TOKEN_COUNT, "203.0.113.2", json=BODY).status_code == 402
    assert through_proxy(proxied, "/a2a", "203.0.113.2", json=rpc).status_code == 402


def test_a_direct_client_cannot_pose_as_others_with_x_forwarded_for(proxied: str) -> None:
    direct = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
    with direct:
        answers = [direct.post(proxied + TOKEN_COUNT, json=BODY,
                               headers={"X-Forwarded-For": f"198.51.100.{n}"}).status_code
                   for n in range(3)]
    assert answers == [402, 402, 429]  # one client, 127.0.0.2, whatever it claims


def test_refused_payments_are_limited_per_real_client(proxied: str) -> None:
    garbage = {"PAYMENT-SIGNATURE": "%%%not-a-payment%%%"}
    r = through_proxy(proxied, TOKEN_COUNT, "203.0.113.5", json=BODY, headers=garbage)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_payment_header"
    assert_429(through_proxy(proxied, TOKEN_COUNT, "203.0.113.5", json=BODY, headers=garbage),
               "PAYWIRE_RATE_PAYMENTS_PER_MINUTE")
    assert through_proxy(proxied, TOKEN_COUNT, "203.0.113.6", json=BODY,
                         headers=garbage).status_code == 400


def test_without_trusted_proxies_uvicorn_ignores_forwarding_headers() -> None:
    plain = uvicorn_config(object(), host="127.0.0.1", port=1)
    assert plain.proxy_headers is False
    proxied = uvicorn_config(object(), host="127.0.0.1", port=1, trusted_proxies=("10.0.0.0/8",))
    assert proxied.proxy_headers is True and proxied.forwarded_allow_ips == ["10.0.0.0/8"]


def test_trusted_proxies_must_be_addresses_or_networks() -> None:
    from agent.settings import ConfigError

    with pytest.raises(ConfigError, match="PAYWIRE_TRUSTED_PROXIES lists 'nginx'"):
        Settings.from_env({"PAYWIRE_TRUSTED_PROXIES": "127.0.0.1,nginx"})
    assert Settings.from_env({"PAYWIRE_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8, ::1"}
                             ).trusted_proxies == ("127.0.0.1", "10.0.0.0/8", "::1")
