"""paywire's own x402 Permit2 proxies and Multicall3 (payments/devnet/contracts), with DevUSDC's
EIP-2612 permit, on three chains: the py-evm devnet, the same devnet with Circle's real
FiatTokenV2_2 as USDC (so DevUSDC's permit is checked against USDC's), and anvil.

Each check of the `upto` and `exact` proxies is called directly and must revert with the custom
error the x402 SDK classifies settle failures by. The SDK's own clients and facilitators settle
through the proxies and the real Permit2, with the payer's approval on chain or signed (EIP-2612).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from web3 import Web3
from x402 import x402Client, x402Facilitator
from x402.extensions.eip2612_gas_sponsoring import declare_eip2612_gas_sponsoring_extension
from x402.mechanisms.evm.constants import (
    MULTICALL3_ADDRESS,
    PERMIT2_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_ABI,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
    X402_UPTO_PERMIT2_PROXY_ABI,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
)
from x402.mechanisms.evm.exact import ExactEvmClientScheme, ExactEvmFacilitatorScheme
from x402.mechanisms.evm.multicall import MulticallCall, multicall
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme, UptoEvmFacilitatorScheme
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements

from payments.devnet.evm import EvmDevnet, load_artifact
from tests.support.evm_anvil import anvil_missing
from tests.support.evm_circle import circle_missing
from tests.support.x402_devnet import X402Chain, contract, revert_name, x402_chain

UPTO = contract("X402UptoPermit2Proxy")
EXACT = contract("X402ExactPermit2Proxy")
TOKEN_ABI = load_artifact()["abi"]  # DevUSDC's: the ERC-20 and EIP-2612 calls Circle's has too
USDC = EvmDevnet.USDC_ADDRESS
NETWORK = EvmDevnet.NETWORK
MAX = 20_000  # what the payer authorizes (0.02 USDC)
USED = 1_858  # what the call cost
FUNDS = 100_000
SIGNATURE = b"\x01" * 65  # never checked: every refusal happens before Permit2 is called
ZERO = "0x" + "00" * 20
LATER = 4_000_000_000  # a validAfter no test run reaches


@pytest.fixture(scope="module", params=["devnet", "circle", "anvil"])
def chain(request: pytest.FixtureRequest) -> Iterator[X402Chain]:
    reason = {"circle": circle_missing, "anvil": anvil_missing}.get(request.param, lambda: None)()
    if reason:
        pytest.skip(reason)
    with x402_chain(request.param) as chain:
        yield chain


def _address() -> str:
    return Account.create().address


FACILITATOR = _address()


def _upto_call(
    *,
    amount: int = MAX // 2,
    permitted: int = MAX,
    owner: str | None = None,
    to: str | None = None,
    facilitator: str = FACILITATOR,
    valid_after: int = 0,
    permit2612_value: int | None = None,
) -> Any:
    """Calldata of the upto proxy's settle (or settleWithPermit, given an EIP-2612 value)."""
    permit = ((USDC, permitted), 1, int(time.time()) + 600)
    witness = (to or _address(), facilitator, valid_after)
    args: list[Any] = [permit, amount, owner or _address(), witness, SIGNATURE]
    return _encode(
        X402_UPTO_PERMIT2_PROXY_ABI, X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI, args, permit2612_value
    )


def _exact_call(
    *,
    permitted: int = MAX,
    owner: str | None = None,
    to: str | None = None,
    valid_after: int = 0,
    permit2612_value: int | None = None,
) -> Any:
    permit = ((USDC, permitted), 1, int(time.time()) + 600)
    args: list[Any] = [permit, owner or _address(), (to or _address(), valid_after), SIGNATURE]
    return _encode(
        X402_EXACT_PERMIT2_PROXY_ABI, X402_EXACT_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI, args, permit2612_value
    )


def _encode(settle_abi: Any, with_permit_abi: Any, args: list[Any], permit2612_value: int | None) -> Any:
    """The SDK's own ABI encodes the call, as its facilitator does."""
    if permit2612_value is None:
        return Web3().eth.contract(abi=settle_abi).encode_abi("settle", args=args)
    permit2612 = (permit2612_value, int(time.time()) + 600, b"\x02" * 32, b"\x03" * 32, 27)
    return Web3().eth.contract(abi=with_permit_abi).encode_abi("settleWithPermit", args=[permit2612, *args])


def _call(chain: X402Chain, sender: str, to: str, data: Any) -> dict[str, Any]:
    return chain.rpc("eth_call", [{"from": sender, "to": to, "data": data}, "latest"])


UPTO_REFUSALS = {
    "InvalidAmount": dict(amount=0),
    "AmountExceedsPermitted": dict(amount=MAX + 1),
    "UnauthorizedFacilitator": dict(facilitator=_address()),
    "InvalidOwner": dict(owner=ZERO),
    "InvalidDestination": dict(to=ZERO),
    "PaymentTooEarly": dict(valid_after=LATER),
    "Permit2612AmountMismatch": dict(permit2612_value=MAX - 1),
}


@pytest.mark.parametrize("error", list(UPTO_REFUSALS))
def test_upto_proxy_refuses_with_the_error_the_sdk_names(chain: X402Chain, error: str) -> None:
    answer = _call(chain, FACILITATOR, X402_UPTO_PERMIT2_PROXY_ADDRESS, _upto_call(**UPTO_REFUSALS[error]))
    assert revert_name(answer, UPTO["abi"]) == error


EXACT_REFUSALS = {
    "InvalidAmount": dict(permitted=0),
    "InvalidOwner": dict(owner=ZERO),
    "InvalidDestination": dict(to=ZERO),
    "PaymentTooEarly": dict(valid_after=LATER),
    "Permit2612AmountMismatch": dict(permit2612_value=MAX + 1),
}


@pytest.mark.parametrize("error", list(EXACT_REFUSALS))
def test_exact_proxy_refuses_with_the_error_the_sdk_names(chain: X402Chain, error: str) -> None:
    answer = _call(chain, _address(), X402_EXACT_PERMIT2_PROXY_ADDRESS, _exact_call(**EXACT_REFUSALS[error]))
    assert revert_name(answer, EXACT["abi"]) == error


# ---- the SDK's clients and facilitators, through the real Permit2 ----


def _requirements(
    chain: X402Chain, scheme: str, pay_to: str, amount: int, **extra: str
) -> PaymentRequirements:
    return PaymentRequirements(
        scheme=scheme,
        network=NETWORK,
        asset=chain.usdc,
        amount=str(amount),
        pay_to=pay_to,
        max_timeout_seconds=300,
        extra={"name": "USDC", "version": "2", **extra},
    )


def _upto_quote(chain: X402Chain, pay_to: str) -> PaymentRequirements:
    facilitator = chain.chain.facilitator_signer().get_addresses()[0]
    return _requirements(chain, "upto", pay_to, MAX, facilitatorAddress=facilitator)


async def _pay(
    chain: X402Chain, payer: LocalAccount, scheme: Any, quote: PaymentRequirements, *, gasless: bool
) -> PaymentPayload:
    client = x402Client().register(NETWORK, scheme(EthAccountSignerWithRPC(payer, chain.rpc_url)))
    offer = PaymentRequired(
        accepts=[quote], extensions=declare_eip2612_gas_sponsoring_extension() if gasless else None
    )
    payload = await client.create_payment_payload(offer)
    assert isinstance(payload, PaymentPayload)
    return payload


def _token(chain: X402Chain) -> Any:
    return chain.w3.eth.contract(address=chain.usdc, abi=TOKEN_ABI)


def _approve_permit2(chain: X402Chain, payer: LocalAccount) -> None:
    """Option A of the specs: the payer's own one-time approval, gas paid by the payer."""
    chain.send(payer, chain.usdc, _token(chain).encode_abi("approve", args=[PERMIT2_ADDRESS, 2**256 - 1]))


async def test_upto_settles_what_was_used_and_only_once(chain: X402Chain) -> None:
    payer, pay_to = chain.funded(FUNDS, gas=True), _address()
    _approve_permit2(chain, payer)
    facilitator = x402Facilitator().register(
        [NETWORK], UptoEvmFacilitatorScheme(chain.chain.facilitator_signer())
    )
    quote = _upto_quote(chain, pay_to)
    payload = await _pay(chain, payer, UptoEvmClientScheme, quote, gasless=False)

    verified = await facilitator.verify(payload, quote)
    assert verified.is_valid, verified.invalid_reason
    settled = await facilitator.settle(payload, quote.model_copy(update={"amount": str(USED)}))
    assert (settled.success, settled.amount, settled.error_reason) == (True, str(USED), None)
    assert [chain.chain.balance_of(a) for a in (pay_to, payer.address)] == [USED, FUNDS - USED]

    again = await facilitator.settle(payload, quote.model_copy(update={"amount": str(USED)}))
    assert not again.success
    assert [chain.chain.balance_of(a) for a in (pay_to, payer.address)] == [USED, FUNDS - USED]


async def test_upto_settles_gasless_with_the_payers_eip2612_permit(chain: X402Chain) -> None:
    """No ETH and no allowance: the signed permit approves Permit2 in the settlement itself."""
    payer, pay_to = chain.funded(FUNDS), _address()
    facilitator = x402Facilitator().register(
        [NETWORK], UptoEvmFacilitatorScheme(chain.chain.facilitator_signer())
    )
    quote = _upto_quote(chain, pay_to)
    payload = await _pay(chain, payer, UptoEvmClientScheme, quote, gasless=True)

    settled = await facilitator.settle(payload, quote.model_copy(update={"amount": str(USED)}))
    assert (settled.success, settled.amount, settled.error_reason) == (True, str(USED), None)
    assert [chain.chain.balance_of(a) for a in (pay_to, payer.address)] == [USED, FUNDS - USED]
    token = _token(chain).functions
    assert token.nonces(payer.address).call() == 1
    # The permit approved exactly the maximum; Permit2 spent what was used.
    assert token.allowance(payer.address, PERMIT2_ADDRESS).call() == MAX - USED
    assert chain.w3.eth.get_balance(payer.address) == 0


async def test_exact_permit2_settles_gasless_for_exactly_the_price(chain: X402Chain) -> None:
    payer, pay_to = chain.funded(FUNDS), _address()
    facilitator = x402Facilitator().register(
        [NETWORK], ExactEvmFacilitatorScheme(chain.chain.facilitator_signer())
    )
    quote = _requirements(chain, "exact", pay_to, USED, assetTransferMethod="permit2")
    payload = await _pay(chain, payer, ExactEvmClientScheme, quote, gasless=True)
    assert payload.payload["permit2Authorization"]["spender"] == X402_EXACT_PERMIT2_PROXY_ADDRESS

    verified = await facilitator.verify(payload, quote)
    assert verified.is_valid, verified.invalid_reason
    settled = await facilitator.settle(payload, quote)
    assert (settled.success, settled.error_reason) == (True, None)
    assert [chain.chain.balance_of(a) for a in (pay_to, payer.address)] == [USED, FUNDS - USED]


# ---- DevUSDC's EIP-2612 permit, as USDC's (the same cases pass on Circle's token) ----


def _signed_permit(
    chain: X402Chain, owner: LocalAccount, spender: str, value: int, nonce: int, deadline: int
) -> bytes:
    typed = {
        "domain": {
            "name": "USDC",
            "version": "2",
            "chainId": EvmDevnet.CHAIN_ID,
            "verifyingContract": chain.usdc,
        },
        "types": {
            "Permit": [
                {"name": "owner", "type": "address"},
                {"name": "spender", "type": "address"},
                {"name": "value", "type": "uint256"},
                {"name": "nonce", "type": "uint256"},
                {"name": "deadline", "type": "uint256"},
            ]
        },
        "primaryType": "Permit",
        "message": {
            "owner": owner.address,
            "spender": spender,
            "value": value,
            "nonce": nonce,
            "deadline": deadline,
        },
    }
    return bytes(owner.sign_message(encode_typed_data(full_message=typed)).signature)


def _permit_call(
    chain: X402Chain, owner: str, spender: str, value: int, deadline: int, signature: bytes
) -> Any:
    r, s, v = signature[:32], signature[32:64], signature[64]
    return _token(chain).encode_abi("permit", args=[owner, spender, value, deadline, v, r, s])


def test_permit_approves_once_like_usdc(chain: X402Chain) -> None:
    owner, spender, relayer = Account.create(), _address(), chain.funded(0, gas=True)
    deadline = chain.now() + 600
    signature = _signed_permit(chain, owner, spender, 777, 0, deadline)
    expired = _signed_permit(chain, owner, spender, 777, 0, chain.now() - 1)
    stranger = _signed_permit(chain, Account.create(), spender, 777, 0, deadline)

    def refusal(data: Any) -> str:
        return _call(chain, relayer.address, chain.usdc, data)["error"]["message"]

    assert refusal(_permit_call(chain, owner.address, spender, 777, chain.now() - 1, expired)).endswith(
        "FiatTokenV2: permit is expired"
    )
    assert refusal(_permit_call(chain, owner.address, spender, 777, deadline, stranger)).endswith(
        "EIP2612: invalid signature"
    )
    chain.send(relayer, chain.usdc, _permit_call(chain, owner.address, spender, 777, deadline, signature))
    token = _token(chain).functions
    assert (token.allowance(owner.address, spender).call(), token.nonces(owner.address).call()) == (777, 1)
    # The nonce moved on: the same permit no longer verifies.
    assert refusal(_permit_call(chain, owner.address, spender, 777, deadline, signature)).endswith(
        "EIP2612: invalid signature"
    )


# ---- Multicall3 ----


def test_multicall3_answers_the_sdks_try_aggregate(chain: X402Chain) -> None:
    holder = chain.funded(1234).address
    results = multicall(
        chain.chain.facilitator_signer(),
        [
            MulticallCall(address=chain.usdc, abi=TOKEN_ABI, function_name="balanceOf", args=(holder,)),
            MulticallCall(address=chain.usdc, abi=TOKEN_ABI, function_name="decimals"),
            # Reverts (only the token's minter may mint): reported, the rest still answer.
            MulticallCall(address=chain.usdc, abi=TOKEN_ABI, function_name="mint", args=(holder, 1)),
        ],
    )
    assert [(r.success, r.result) for r in results[:2]] == [(True, 1234), (True, 6)]
    assert results[2].success is False


def test_multicall3_require_success_and_aggregate3(chain: X402Chain) -> None:
    mc = chain.w3.eth.contract(address=MULTICALL3_ADDRESS, abi=contract("Multicall3")["abi"])
    token = _token(chain)
    ok = (chain.usdc, token.encode_abi("decimals", args=[]))
    failing = (chain.usdc, token.encode_abi("mint", args=[_address(), 1]))
    strict = _call(
        chain, _address(), MULTICALL3_ADDRESS, mc.encode_abi("tryAggregate", args=[True, [ok, failing]])
    )
    assert strict["error"]["message"].endswith("Multicall3: call failed")
    results = mc.functions.aggregate3([(ok[0], True, ok[1]), (failing[0], True, failing[1])]).call()
    assert [success for success, _ in results] == [True, False]
    assert int.from_bytes(results[0][1], "big") == 6
    refused = _call(
        chain,
        _address(),
        MULTICALL3_ADDRESS,
        mc.encode_abi("aggregate3", args=[[(failing[0], False, failing[1])]]),
    )
    assert refused["error"]["message"].endswith("Multicall3: call failed")
