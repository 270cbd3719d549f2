"""The in-process EVM devnet, driven end to end by the real x402 SDK.

Client: the SDK's exact EVM client scheme with an `EthAccountSigner` over a fresh key.
Facilitator: the SDK's `x402Facilitator` with `register_exact_evm_facilitator`, over
`EvmDevnet.facilitator_signer()` (the SDK's own FacilitatorWeb3Signer on the in-process chain)
or, for anvil and the HTTP test, the plain `FacilitatorWeb3Signer(private_key, rpc_url)`.

The same payment cases run on three chains holding a token at Base Sepolia's USDC address:
- "devnet": EvmDevnet with DevUSDC (what `paywire serve` runs);
- "circle": EvmDevnet with Circle's real FiatTokenV2_2 behind its proxy (npm artifacts);
- "anvil": an anvil node with DevUSDC set by anvil_setCode, facilitator over HTTP.
So DevUSDC is checked against the real token and py-evm against a production node.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from eth_abi import encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3.exceptions import ContractLogicError
from x402 import x402Facilitator, x402FacilitatorSync
from x402.mechanisms.evm.constants import (
    ERR_AUTHORIZATION_VALUE_MISMATCH,
    ERR_INSUFFICIENT_BALANCE,
    ERR_INVALID_SIGNATURE,
    ERR_NONCE_ALREADY_USED,
    ERR_RECIPIENT_MISMATCH,
    ERR_TRANSACTION_FAILED,
    ERR_VALID_AFTER_FUTURE,
    ERR_VALID_BEFORE_EXPIRED,
)
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.evm.exact.eip3009_utils import parse_eip3009_transfer_error
from x402.mechanisms.evm.signers import FacilitatorWeb3Signer
from x402.schemas import PaymentPayload

from payments.devnet import jsonrpc
from payments.devnet.contracts import build as contract_build
from payments.devnet.evm import ARTIFACT_PATH, BLOCK_TIME_SECONDS, EvmDevnet, load_artifact
from tests.support.evm_anvil import AnvilUsdc, anvil_usdc  # noqa: F401  (fixture)
from tests.support.evm_circle import circle_missing, deploy_circle_usdc
from tests.support.evm_x402 import (
    NETWORK,
    EvmChain,
    authorization,
    new_facilitator,
    quote,
    quote_v1,
    sign_payment,
    sign_payment_v1,
)
from tests.support.jsonrpc_http import JsonRpcHttpServer

PRICE = 10_000  # 0.01 USDC
FUNDS = 100_000  # 0.1 USDC (the SDK client refuses to pay over $1 by default)
USDC = EvmDevnet.USDC_ADDRESS
ABI = load_artifact()["abi"]  # DevUSDC's
LOAD_SETTLEMENTS = 500


def new_key() -> str:
    return Account.create().key.hex()


def new_devnet(**kwargs: Any) -> EvmDevnet:
    return EvmDevnet(facilitator_key=new_key(), minter_key=new_key(), **kwargs)


def facilitator_address(devnet: EvmDevnet) -> str:
    return devnet.facilitator_signer().get_addresses()[0]


class FakeClock:
    """Unix time the test moves by hand (idle hours without sleeping)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """A chain with a USDC-like token and the SDK facilitator that settles on it."""

    name: str
    chain: EvmChain
    facilitator: x402Facilitator

    def funded_payer(self, amount: int = FUNDS) -> LocalAccount:
        payer: LocalAccount = Account.create()
        if amount:
            self.chain.mint(payer.address, amount)
        return payer

    def balances(self, *accounts: str) -> list[int]:
        return [self.chain.balance_of(a) for a in accounts]


@pytest.fixture(scope="module", params=["devnet", "circle", "anvil"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    chain: EvmChain
    if request.param == "devnet":
        chain = new_devnet()
    elif request.param == "circle":
        reason = circle_missing()
        if reason:
            pytest.skip(reason)
        chain = deploy_circle_usdc(facilitator_key=new_key(), minter_key=new_key())
    else:
        chain = request.getfixturevalue("anvil_usdc")
    yield Harness(request.param, chain, new_facilitator(chain.facilitator_signer()))


@pytest.fixture
def devnet() -> EvmDevnet:
    return new_devnet()


# ---- the SDK flow on every chain ----


async def test_settle_moves_exactly_the_amount(harness: Harness) -> None:
    payer, pay_to = harness.funded_payer(), Account.create()
    requirements = quote(USDC, pay_to.address, PRICE)
    payload = await sign_payment(payer, requirements)

    verified = await harness.facilitator.verify(payload, requirements)
    assert verified.is_valid, verified
    assert verified.payer == payer.address
    assert harness.balances(payer.address, pay_to.address) == [FUNDS, 0]  # verify moves nothing

    settled = await harness.facilitator.settle(payload, requirements)
    assert settled.success, settled
    assert settled.network == NETWORK and settled.payer == payer.address
    assert settled.transaction.startswith("0x") and len(settled.transaction) == 66
    assert harness.balances(payer.address, pay_to.address) == [FUNDS - PRICE, PRICE]


async def test_v1_payload_with_past_valid_after_settles(harness: Harness) -> None:
    """Legacy clients sign validAfter = now - 600; the chain clock must be past it."""
    payer, pay_to = harness.funded_payer(), Account.create()
    requirements = quote_v1(USDC, pay_to.address, PRICE)
    payload = await sign_payment_v1(payer, requirements)
    assert int(payload.payload["authorization"]["validAfter"]) > 0

    assert (await harness.facilitator.verify(payload, requirements)).is_valid
    assert (await harness.facilitator.settle(payload, requirements)).success
    assert harness.balances(payer.address, pay_to.address) == [FUNDS - PRICE, PRICE]


async def _amount_mismatch(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    payload = await sign_payment(payer, quote(USDC, pay_to, PRICE))
    return payload, quote(USDC, pay_to, 2 * PRICE), ERR_AUTHORIZATION_VALUE_MISMATCH


async def _tampered_amount(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    # The value is edited after signing to match a dearer quote: the signature no longer fits.
    dearer = quote(USDC, pay_to, 2 * PRICE)
    payload = (await sign_payment(payer, quote(USDC, pay_to, PRICE))).model_copy(deep=True)
    authorization(payload)["value"] = str(2 * PRICE)
    payload.accepted = dearer
    return payload, dearer, ERR_INVALID_SIGNATURE


async def _wrong_pay_to(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    payload = await sign_payment(payer, quote(USDC, pay_to, PRICE))
    return payload, quote(USDC, Account.create().address, PRICE), ERR_RECIPIENT_MISMATCH


async def _bad_signature(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    # Signed by someone else, claiming to be from the funded payer.
    requirements = quote(USDC, pay_to, PRICE)
    payload = (await sign_payment(Account.create(), requirements)).model_copy(deep=True)
    authorization(payload)["from"] = payer.address
    return payload, requirements, ERR_INVALID_SIGNATURE


async def _expired(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    # validBefore = now + 1: inside the SDK's 6 s safety margin, so already expired for it.
    requirements = quote(USDC, pay_to, PRICE, max_timeout_seconds=1)
    return await sign_payment(payer, requirements), requirements, ERR_VALID_BEFORE_EXPIRED


async def _insufficient_balance(h: Harness, payer: LocalAccount, pay_to: str) -> Any:
    requirements = quote(USDC, pay_to, FUNDS + 1)
    return await sign_payment(payer, requirements), requirements, ERR_INSUFFICIENT_BALANCE


@pytest.mark.parametrize(
    "case",
    [
        _amount_mismatch,
        _tampered_amount,
        _wrong_pay_to,
        _bad_signature,
        _expired,
        _insufficient_balance,
    ],
    ids=lambda case: case.__name__.strip("_"),
)
async def test_verify_rejects_with_the_sdk_reason(harness: Harness, case: Any) -> None:
    payer, pay_to = harness.funded_payer(), Account.create()
    payload, requirements, reason = await case(harness, payer, pay_to.address)

    verified = await harness.facilitator.verify(payload, requirements)
    assert not verified.is_valid
    assert verified.invalid_reason == reason, verified
    assert harness.balances(payer.address, pay_to.address) == [FUNDS, 0]


async def test_second_settle_of_one_authorization_fails(harness: Harness) -> None:
    payer, pay_to = harness.funded_payer(), Account.create()
    requirements = quote(USDC, pay_to.address, PRICE)
    payload = await sign_payment(payer, requirements)
    assert (await harness.facilitator.settle(payload, requirements)).success

    again = await harness.facilitator.settle(payload, requirements)
    # settle re-verifies without simulating (SDK default), so the replay is broadcast and
    # reverts on chain ("authorization is used or canceled"): a failed receipt.
    assert not again.success
    assert again.error_reason == ERR_TRANSACTION_FAILED
    assert harness.balances(payer.address, pay_to.address) == [FUNDS - PRICE, PRICE]
    verified = await harness.facilitator.verify(payload, requirements)
    assert verified.invalid_reason == ERR_NONCE_ALREADY_USED


async def test_payer_drained_after_verify(harness: Harness) -> None:
    payer, pay_to = harness.funded_payer(), Account.create()
    requirements = quote(USDC, pay_to.address, PRICE)
    payload = await sign_payment(payer, requirements)
    assert (await harness.facilitator.verify(payload, requirements)).is_valid

    harness.chain.transfer(payer.key.hex(), Account.create().address, FUNDS)

    verified = await harness.facilitator.verify(payload, requirements)
    assert verified.invalid_reason == ERR_INSUFFICIENT_BALANCE
    settled = await harness.facilitator.settle(payload, requirements)
    assert not settled.success
    assert harness.balances(payer.address, pay_to.address) == [0, 0]


# ---- the devnet itself ----


def test_token_is_base_sepolia_usdc_lookalike(devnet: EvmDevnet) -> None:
    w3 = devnet.w3
    assert w3.eth.chain_id == EvmDevnet.CHAIN_ID == 84532
    assert EvmDevnet.NETWORK == "eip155:84532"
    assert w3.eth.get_code(USDC).to_0x_hex() == load_artifact()["deployedBytecode"]
    token = w3.eth.contract(address=USDC, abi=ABI)
    f = token.functions
    assert (f.name().call(), f.symbol().call(), f.decimals().call(), f.version().call()) == (
        "USDC",
        "USDC",
        6,
        "2",
    )
    assert f.minter().call() == devnet.minter_address
    domain_typehash = keccak(
        text="EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
    )
    expected = keccak(
        encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [domain_typehash, keccak(text="USDC"), keccak(text="2"), 84532, USDC],
        )
    )
    assert f.DOMAIN_SEPARATOR().call() == expected
    assert w3.eth.get_balance(facilitator_address(devnet)) > 0


def _sign_authorization(
    devnet: EvmDevnet,
    payer: LocalAccount,
    *,
    to: str,
    value: int,
    valid_after: int = 0,
    valid_before: int | None = None,
    nonce: bytes | None = None,
    primary: str = "TransferWithAuthorization",
) -> dict[str, Any]:
    fields = ["from", "to", "value", "validAfter", "validBefore", "nonce"]
    kinds = ["address", "address", "uint256", "uint256", "uint256", "bytes32"]
    message = {
        "from": payer.address,
        "to": to,
        "value": value,
        "validAfter": valid_after,
        "validBefore": valid_before if valid_before is not None else int(time.time()) + 600,
        "nonce": nonce or Account.create().key,
    }
    signed = payer.sign_typed_data(
        {"name": "USDC", "version": "2", "chainId": devnet.CHAIN_ID, "verifyingContract": USDC},
        {primary: [{"name": n, "type": t} for n, t in zip(fields, kinds, strict=True)]},
        message,
    )
    return {"args": [message[n] for n in fields], "signature": bytes(signed.signature)}


def _revert_reason(call: Any, sender: str) -> str:
    with pytest.raises(ContractLogicError) as raised:
        call.call({"from": sender})
    return parse_eip3009_transfer_error(raised.value)


def test_contract_reverts_like_fiattoken(devnet: EvmDevnet) -> None:
    """The revert strings the SDK classifies, straight from DevUSDC, on both overloads."""
    payer, pay_to = Account.create(), Account.create().address
    devnet.mint(payer.address, FUNDS)
    token = devnet.w3.eth.contract(address=USDC, abi=ABI)
    vrs = token.get_function_by_signature(
        "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"
    )
    packed = token.get_function_by_signature(
        "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
    )

    def both(auth: dict[str, Any]) -> list[Any]:
        sig = auth["signature"]
        return [vrs(*auth["args"], sig[64], sig[:32], sig[32:64]), packed(*auth["args"], sig)]

    now, sender = int(time.time()), facilitator_address(devnet)
    cases = {
        ERR_VALID_BEFORE_EXPIRED: _sign_authorization(
            devnet, payer, to=pay_to, value=PRICE, valid_before=now - 100
        ),
        ERR_VALID_AFTER_FUTURE: _sign_authorization(
            devnet, payer, to=pay_to, value=PRICE, valid_after=now + 1_000
        ),
        ERR_INSUFFICIENT_BALANCE: _sign_authorization(devnet, payer, to=pay_to, value=FUNDS + 1),
    }
    for reason, auth in cases.items():
        for call in both(auth):
            assert _revert_reason(call, sender) == reason
    forged = _sign_authorization(devnet, Account.create(), to=pay_to, value=PRICE)
    forged["args"][0] = payer.address
    for call in both(forged):
        assert _revert_reason(call, sender) == ERR_INVALID_SIGNATURE

    # The bytes overload settles; the nonce is then spent for both overloads.
    auth = _sign_authorization(devnet, payer, to=pay_to, value=PRICE)
    signer = devnet.facilitator_signer()
    tx = signer.write_contract(
        USDC, ABI, "transferWithAuthorization", *auth["args"], auth["signature"]
    )
    assert signer.wait_for_transaction_receipt(tx).status == 1
    assert devnet.balance_of(pay_to) == PRICE
    assert token.functions.authorizationState(payer.address, auth["args"][5]).call()
    for call in both(auth):
        assert _revert_reason(call, sender) == ERR_NONCE_ALREADY_USED


async def test_cancel_and_receive_with_authorization(devnet: EvmDevnet) -> None:
    payer, pay_to = Account.create(), Account.create()
    devnet.mint(payer.address, FUNDS)
    token = devnet.w3.eth.contract(address=USDC, abi=ABI)
    facilitator = new_facilitator(devnet.facilitator_signer())

    # A payer cancels a signed-but-unsettled x402 payment: verify then reports the nonce used.
    requirements = quote(USDC, pay_to.address, PRICE)
    payload = await sign_payment(payer, requirements)
    nonce = bytes.fromhex(authorization(payload)["nonce"][2:])
    cancel = payer.sign_typed_data(
        {"name": "USDC", "version": "2", "chainId": devnet.CHAIN_ID, "verifyingContract": USDC},
        {
            "CancelAuthorization": [
                {"name": "authorizer", "type": "address"},
                {"name": "nonce", "type": "bytes32"},
            ]
        },
        {"authorizer": payer.address, "nonce": nonce},
    )
    signer = devnet.facilitator_signer()
    tx = signer.write_contract(
        USDC, ABI, "cancelAuthorization", payer.address, nonce, bytes(cancel.signature)
    )
    assert signer.wait_for_transaction_receipt(tx).status == 1
    assert (await facilitator.verify(payload, requirements)).invalid_reason == (ERR_NONCE_ALREADY_USED)

    # receiveWithAuthorization only lets the payee submit.
    auth = _sign_authorization(
        devnet, payer, to=pay_to.address, value=PRICE, primary="ReceiveWithAuthorization"
    )
    receive = token.get_function_by_signature(
        "receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
    )(*auth["args"], auth["signature"])
    with pytest.raises(ContractLogicError, match="caller must be the payee"):
        receive.call({"from": facilitator_address(devnet)})
    receive.call({"from": pay_to.address})  # would succeed from the payee


async def test_chain_clock_catches_up_after_idle() -> None:
    """An hour of idling must not leave calls and transactions on an hour-old timestamp."""
    clock = FakeClock(time.time() - 3600)
    devnet = new_devnet(clock=clock)
    payer, pay_to = Account.create(), Account.create()
    devnet.mint(payer.address, FUNDS)
    head = devnet.w3.eth.get_block("latest")
    assert abs(head["timestamp"] - clock.now) <= 1
    # Reads within Base's block time mine nothing: blocks are made lazily, not by a thread.
    number = head["number"]
    devnet.balance_of(payer.address)
    assert devnet.w3.eth.block_number == number

    clock.now = time.time()  # an hour later: the client signs validAfter = now - 600
    facilitator = new_facilitator(devnet.facilitator_signer())
    requirements = quote_v1(USDC, pay_to.address, PRICE)
    payload = await sign_payment_v1(payer, requirements)
    assert (await facilitator.verify(payload, requirements)).is_valid
    settled = await facilitator.settle(payload, requirements)
    assert settled.success, settled
    block = devnet.w3.eth.get_block(devnet.w3.eth.get_transaction(settled.transaction)["blockHash"])
    assert clock.now - BLOCK_TIME_SECONDS <= block["timestamp"] <= clock.now + 1


async def test_chain_clock_keeps_to_the_wall_clock_under_load() -> None:
    """Hundreds of settlements a second leave the chain on the wall clock's second.

    Each transaction is mined at once in a block of its own. When every block had to be a second
    later than its parent, 500 settlements in 8 s put the chain 490 s ahead, and from the 300th
    on every new authorization (validBefore = now + 300) was already expired on chain.
    """
    facilitator_key = new_key()
    devnet = EvmDevnet(facilitator_key=facilitator_key, minter_key=new_key())
    facilitator: LocalAccount = Account.from_key(facilitator_key)
    payer, pay_to = Account.create(), Account.create().address
    devnet.mint(payer.address, LOAD_SETTLEMENTS * PRICE + FUNDS)
    requirements = quote(USDC, pay_to, PRICE)
    transfer = devnet.w3.eth.contract(address=USDC, abi=ABI).get_function_by_signature(
        "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
    )
    nonce = devnet.w3.eth.get_transaction_count(facilitator.address)
    fees = {"maxFeePerGas": 2 * devnet.w3.eth.get_block("latest")["baseFeePerGas"] + 10**6,
            "maxPriorityFeePerGas": 10**6}
    first_block = devnet.w3.eth.block_number

    started = time.time()
    for i in range(LOAD_SETTLEMENTS):
        # The SDK client signs the EIP-3009 authorization; the facilitator key broadcasts it.
        payload = await sign_payment(payer, requirements)
        auth = authorization(payload)
        call = transfer(auth["from"], auth["to"], int(auth["value"]), int(auth["validAfter"]),
                        int(auth["validBefore"]), bytes.fromhex(auth["nonce"][2:]),
                        bytes.fromhex(payload.payload["signature"][2:]))
        tx = {"to": USDC, "data": call._encode_transaction_data(), "value": 0, "gas": 200_000,
              "nonce": nonce + i, "chainId": EvmDevnet.CHAIN_ID, **fees}
        raw = "0x" + facilitator.sign_transaction(tx).raw_transaction.hex()
        assert "result" in devnet.rpc("eth_sendRawTransaction", [raw])
    elapsed = time.time() - started
    assert devnet.balance_of(pay_to) == LOAD_SETTLEMENTS * PRICE  # every one settled
    blocks = devnet.w3.eth.block_number - first_block
    assert blocks >= LOAD_SETTLEMENTS and blocks > 2 * elapsed  # well above a block a second

    # One more, the whole SDK way: verified and settled, not expired on arrival.
    facilitator_sdk = new_facilitator(devnet.facilitator_signer())
    payload = await sign_payment(payer, requirements)
    assert (await facilitator_sdk.verify(payload, requirements)).is_valid
    settled = await facilitator_sdk.settle(payload, requirements)
    assert settled.success, settled
    ahead = devnet.w3.eth.get_block("latest")["timestamp"] - time.time()
    assert ahead <= 2, f"the chain is {ahead:.0f} s ahead of the wall clock"


async def test_concurrent_settles_and_reads_from_worker_threads(devnet: EvmDevnet) -> None:
    """paywire calls the signer via asyncio.to_thread while other threads read balances."""
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, devnet.facilitator_signer(), networks=NETWORK)
    pay_to = Account.create().address
    payers = [Account.create() for _ in range(8)]
    await asyncio.gather(*(asyncio.to_thread(devnet.mint, p.address, FUNDS) for p in payers))
    requirements = quote(USDC, pay_to, PRICE)
    payloads = [await sign_payment(p, requirements) for p in payers]

    def settle(payload: PaymentPayload) -> bool:
        verified = facilitator.verify(payload, requirements)
        return verified.is_valid and facilitator.settle(payload, requirements).success

    results = await asyncio.gather(
        *(asyncio.to_thread(settle, p) for p in payloads),
        *(asyncio.to_thread(devnet.balance_of, p.address) for p in payers for _ in range(3)),
    )
    assert results[: len(payers)] == [True] * len(payers)
    assert devnet.balance_of(pay_to) == PRICE * len(payers)
    assert {devnet.balance_of(p.address) for p in payers} == {FUNDS - PRICE}


async def test_served_over_http_to_the_sdk_web3_signer() -> None:
    """`rpc` speaks wire JSON-RPC: the production signer works against it over loopback."""
    facilitator_key = new_key()
    devnet = EvmDevnet(facilitator_key=facilitator_key, minter_key=new_key())
    payer, pay_to = Account.create(), Account.create()
    devnet.mint(payer.address, FUNDS)
    with JsonRpcHttpServer(devnet.rpc) as server:
        signer = FacilitatorWeb3Signer(facilitator_key, server.url)
        facilitator = new_facilitator(signer)
        requirements = quote(USDC, pay_to.address, PRICE)
        payload = await sign_payment(payer, requirements)
        # The server answers from its own thread, so the SDK's blocking HTTP calls are fine here.
        verified = await facilitator.verify(payload, requirements)
        assert verified.is_valid, verified
        settled = await facilitator.settle(payload, requirements)
        assert settled.success, settled
    assert devnet.balance_of(pay_to.address) == PRICE


def test_future_nonce_waits_for_the_gap_like_a_node() -> None:
    sender_key = new_key()
    devnet = EvmDevnet(facilitator_key=sender_key, minter_key=new_key())
    sender, w3 = Account.from_key(sender_key), devnet.w3
    to = Account.create().address

    def raw(nonce: int) -> str:
        tx = {
            "to": to,
            "value": 1,
            "gas": 21_000,
            "gasPrice": w3.eth.gas_price,
            "nonce": nonce,
            "chainId": devnet.CHAIN_ID,
        }
        return "0x" + sender.sign_transaction(tx).raw_transaction.hex()

    later = devnet.rpc("eth_sendRawTransaction", [raw(1)])["result"]
    assert devnet.rpc("eth_getTransactionReceipt", [later])["result"] is None  # queued
    first = devnet.rpc("eth_sendRawTransaction", [raw(0)])["result"]
    for tx_hash in (first, later):
        assert devnet.rpc("eth_getTransactionReceipt", [tx_hash])["result"]["status"] == "0x1"
    assert w3.eth.get_balance(to) == 2
    too_low = devnet.rpc("eth_sendRawTransaction", [raw(1)])["error"]
    assert too_low["code"] == -32000 and "nonce too low" in too_low["message"]


def test_facilitator_signer_is_the_sdk_web3_signer() -> None:
    facilitator_key = new_key()
    devnet = EvmDevnet(facilitator_key=facilitator_key, minter_key=new_key())
    signer = devnet.facilitator_signer()
    assert isinstance(signer, FacilitatorWeb3Signer)
    assert signer.get_addresses() == [Account.from_key(facilitator_key).address]
    assert signer.get_chain_id() == EvmDevnet.CHAIN_ID
    assert signer.get_balance(devnet.minter_address, USDC) == 0
    assert devnet.facilitator_signer() is signer  # one nonce tracker per devnet


def test_rpc_surface(devnet: EvmDevnet) -> None:
    assert devnet.rpc("eth_chainId", []) == {"result": "0x14a34"}
    assert devnet.rpc("net_version", [])["result"] == "84532"
    assert devnet.rpc("eth_accounts", [])["result"] == []  # no unlocked keys
    for method in ("evm_snapshot", "evm_revert", "testing_timeTravel", "eth_sendTransaction"):
        assert devnet.rpc(method, [{}])["error"]["code"] == -32601, method
    transfer = "0xa9059cbb" + "00" * 12 + "11" * 20 + f"{FUNDS:064x}"
    reverted = devnet.rpc("eth_call", [{"to": USDC, "input": transfer}, "latest"])["error"]
    assert reverted["code"] == 3
    assert reverted["message"] == "execution reverted: ERC20: transfer from the zero address"
    assert reverted["data"].startswith("0x08c379a0")
    head = devnet.rpc("eth_blockNumber", [])["result"]  # 0x1 once Permit2 is deployed (CREATE2)
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"},
        5,
        {"jsonrpc": "2.0", "id": "b", "method": "eth_chainId", "params": {}},
        {"jsonrpc": "2.0", "id": True, "method": "eth_nope", "params": []},
    ]
    reply = jsonrpc.answer(batch, devnet.rpc)
    assert reply.status == 200
    assert [(a["id"], a.get("result"), a.get("error", {}).get("code")) for a in reply.body] == [
        (1, head, None),
        (None, None, -32600),  # not a call
        ("b", None, -32600),  # params must be an array
        (None, None, -32601),  # an id no client can carry is answered as null
    ]
    assert jsonrpc.answer([], devnet.rpc).status == 400
    assert jsonrpc.answer([{"method": "eth_chainId"}] * 101, devnet.rpc).status == 400


def test_artifact_is_built_from_the_committed_source() -> None:
    artifact = load_artifact()
    source = ARTIFACT_PATH.with_name("DevUSDC.sol").read_bytes()
    assert artifact["sourceSha256"] == hashlib.sha256(source).hexdigest()
    assert artifact["compiler"]["version"].startswith("0.8.37+")
    assert artifact["storageLayout"]["minter"] == artifact["minterSlot"] == 0
    if shutil.which("node") is None or not contract_build.SOLC.is_dir():
        pytest.skip("node/solc not installed: cannot rebuild the artifact")
    rebuilt = subprocess.run(
        [sys.executable, contract_build.__file__, "--check"], capture_output=True, text=True
    )
    assert rebuilt.returncode == 0, rebuilt.stderr


def test_anvil_fixture_exposes_the_production_rpc_path(anvil_usdc: AnvilUsdc) -> None:  # noqa: F811
    assert anvil_usdc.w3.eth.chain_id == EvmDevnet.CHAIN_ID
    assert anvil_usdc.w3.eth.get_code(USDC).to_0x_hex() == load_artifact()["deployedBytecode"]
    signer = anvil_usdc.facilitator_signer()
    assert type(signer) is FacilitatorWeb3Signer
