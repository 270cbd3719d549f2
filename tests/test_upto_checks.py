"""`upto` payments (x402's Permit2 scheme on EVM) checked before any facilitator is asked:
the payload's shape (payments/payload_shape.py), what every facilitator refuses
(payments/precheck.py `local_refusal`) and the payer a signature proves (`proven_payer`).

Payloads are signed by the x402 SDK's own upto client; a term a client could get wrong is made
wrong by asking that client to sign other terms than the quote's. Every local refusal is checked
against the SDK's own facilitator check (`verify_upto_permit2`, on a signer that reads no chain:
every refusal here comes before its chain reads), so the reason is the one a facilitator would
give. In process, no chain, no sockets.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402.mechanisms.evm.constants import X402_UPTO_PERMIT2_PROXY_ADDRESS
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.mechanisms.evm.upto import UptoEvmClientScheme
from x402.mechanisms.evm.upto.permit2_utils import verify_upto_permit2
from x402.schemas import PaymentPayload, PaymentRequirements, VerifyResponse

from payments.networks import BASE_SEPOLIA
from payments.payload_shape import payload_problem
from payments.precheck import local_refusal, proven_payer

NETWORK = BASE_SEPOLIA.caip2
USDC = BASE_SEPOLIA.usdc
MAX = 20_000  # the quoted maximum (atomic USDC)
FACILITATOR = Account.create().address
PAY_TO = Account.create().address
WHERE = "payload.permit2Authorization"


def quote(**changes: Any) -> PaymentRequirements:
    """An `upto` requirement as the SDK's upto server builds it for paywire."""
    base = PaymentRequirements(
        scheme="upto", network=NETWORK, asset=USDC, amount=str(MAX), pay_to=PAY_TO,
        max_timeout_seconds=300,
        extra={"name": "USDC", "version": "2", "assetTransferMethod": "permit2",
               "facilitatorAddress": FACILITATOR})
    return base.model_copy(update=changes, deep=True)


def signed(payer: LocalAccount, requirement: PaymentRequirements | None = None) -> dict[str, Any]:
    """The payload the SDK's upto client signs for `requirement` (the quote by default)."""
    return UptoEvmClientScheme(EthAccountSigner(payer)).create_payment_payload(requirement or quote())


class NoChainSigner:
    """A facilitator signer for the SDK's checks that come before any chain read: its address,
    and an asset that is a contract (the one read a well-formed payload leads to)."""

    def get_addresses(self) -> list[str]:
        return [FACILITATOR]

    def get_code(self, address: str) -> bytes:
        return b"\x60" if address.lower() == USDC.lower() else b""


def sdk_verify(payload: dict[str, Any], requirement: PaymentRequirements) -> VerifyResponse:
    """What the SDK's upto facilitator answers (simulation off: no chain)."""
    paid = PaymentPayload(x402_version=2, payload=payload, accepted=requirement)
    return verify_upto_permit2(NoChainSigner(), paid, requirement, simulate=False)  # type: ignore[arg-type]


def with_field(payload: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `payload` with the dotted field set (or removed, for `...`)."""
    changed = copy.deepcopy(payload)
    *parents, name = path.split(".")
    node = changed
    for step in parents:
        node = node[step]
    if value is ...:
        del node[name]
    else:
        node[name] = value
    return changed


# ---- the shape ----------------------------------------------------------------------------------


def test_the_sdks_upto_payload_passes_every_check_and_proves_its_payer() -> None:
    payer = Account.create()
    payload = signed(payer)
    assert payload_problem("upto", NETWORK, payload) is None
    assert local_refusal(payload, quote()) is None
    assert proven_payer(payload, quote()) == payer.address.lower()
    assert sdk_verify(payload, quote()).is_valid  # what a facilitator says of it too


ADDRESS = "must be an address (0x + 40 hex digits)"
UINT = "must be a whole number below 2**256 (decimal digits)"
SHAPES = [
    ("permit2Authorization", ..., f"{WHERE} must be a Permit2 PermitWitnessTransferFrom object "
                                  "(the upto scheme's)"),
    ("permit2Authorization", "0x", f"{WHERE} must be a Permit2 PermitWitnessTransferFrom object "
                                   "(the upto scheme's)"),
    ("permit2Authorization.from", "0x1234", f"{WHERE}.from {ADDRESS}"),
    ("permit2Authorization.permitted", [], f"{WHERE}.permitted must be an object"),
    ("permit2Authorization.permitted.token", None, f"{WHERE}.permitted.token {ADDRESS}"),
    ("permit2Authorization.permitted.amount", "-1", f"{WHERE}.permitted.amount {UINT}"),
    ("permit2Authorization.permitted.amount", "1e6", f"{WHERE}.permitted.amount {UINT}"),
    ("permit2Authorization.permitted.amount", "0x4e20", f"{WHERE}.permitted.amount {UINT}"),
    ("permit2Authorization.permitted.amount", True, f"{WHERE}.permitted.amount {UINT}"),
    ("permit2Authorization.spender", "0x" + "g" * 40, f"{WHERE}.spender {ADDRESS}"),
    ("permit2Authorization.nonce", str(2**256), f"{WHERE}.nonce {UINT}"),
    ("permit2Authorization.nonce", " 7", f"{WHERE}.nonce {UINT}"),
    ("permit2Authorization.deadline", 1.5, f"{WHERE}.deadline {UINT}"),
    ("permit2Authorization.witness", "to", f"{WHERE}.witness must be an object"),
    ("permit2Authorization.witness.to", ..., f"{WHERE}.witness.to {ADDRESS}"),
    ("permit2Authorization.witness.facilitator", 7, f"{WHERE}.witness.facilitator {ADDRESS}"),
    ("permit2Authorization.witness.validAfter", "1_000", f"{WHERE}.witness.validAfter {UINT}"),
    ("signature", ..., "payload.signature must be a hex signature (0x + at least 65 bytes)"),
    ("signature", "0x" + "ab" * 64, "payload.signature must be a hex signature (0x + at least 65 bytes)"),
]


@pytest.mark.parametrize(("path", "value", "problem"), SHAPES,
                         ids=[f"{path}={value!r}" for path, value, _ in SHAPES])
def test_a_malformed_upto_payload_is_refused_naming_the_field(path: str, value: Any,
                                                              problem: str) -> None:
    payload = with_field(signed(Account.create()), path, value)
    assert payload_problem("upto", NETWORK, payload) == problem


def test_the_shape_checked_is_the_schemes() -> None:
    upto = signed(Account.create())
    eip3009 = {"authorization": {"from": Account.create().address, "to": PAY_TO, "value": "1",
                                 "validAfter": "0", "validBefore": str(2**256),
                                 "nonce": "0x" + "ab" * 32}, "signature": "0x" + "cd" * 65}
    # An EIP-3009 payload offered as upto, and an upto payload offered as exact.
    assert payload_problem("upto", NETWORK, eip3009) == (
        f"{WHERE} must be a Permit2 PermitWitnessTransferFrom object (the upto scheme's)")
    assert payload_problem("exact", NETWORK, upto) == (
        "payload.authorization must be an EIP-3009 authorization object")
    # exact's numbers are bounded the same way: an int() the SDK would take, then fail to encode.
    assert payload_problem("exact", NETWORK, eip3009) == (
        f"payload.authorization.validBefore {UINT}")
    assert payload_problem("upto", NETWORK, [upto]) == "the payment's payload must be an object"


# ---- what every facilitator refuses ------------------------------------------------------------

OTHER = Account.create().address


def _resigned(**changes: Any) -> tuple[dict[str, Any], str]:
    """A payload the SDK's client signed for other terms than the quote's."""
    payer = Account.create()
    return signed(payer, quote(**changes)), payer.address


def _edited(path: str, value: Any) -> tuple[dict[str, Any], str]:
    """A term the SDK's client never varies, edited after signing."""
    payer = Account.create()
    return with_field(signed(payer), path, value), payer.address


REFUSALS = {
    "spender": (lambda: _edited("permit2Authorization.spender", OTHER), "invalid_permit2_spender",
                f"{WHERE}.spender is {OTHER}, not the x402 upto Permit2 proxy "
                f"{X402_UPTO_PERMIT2_PROXY_ADDRESS}; sign the quoted terms"),
    "recipient": (lambda: _resigned(pay_to=OTHER), "invalid_permit2_recipient_mismatch",
                  f"{WHERE}.witness.to is not the quote's payTo {PAY_TO}; sign the quoted terms"),
    "facilitator": (lambda: _resigned(extra={**quote().extra, "facilitatorAddress": OTHER}),
                    "upto_facilitator_mismatch",
                    f"{WHERE}.witness.facilitator is not the quote's extra.facilitatorAddress "
                    f"{FACILITATOR}: only that address can settle it; sign the quoted terms"),
    "deadline": (lambda: _resigned(max_timeout_seconds=2), "permit2_deadline_expired",
                 f"{WHERE}.deadline has passed (or is less than 6 s away); sign a new payment"),
    "validAfter": (lambda: _edited("permit2Authorization.witness.validAfter",
                                   str(int(time.time()) + 60)), "permit2_not_yet_valid",
                   f"{WHERE}.witness.validAfter is in the future; sign a payment valid now"),
    "amount": (lambda: _resigned(amount=str(MAX - 1)), "permit2_amount_mismatch",
               f"{WHERE}.permitted.amount is {MAX - 1}, the quoted maximum is {MAX}; sign the "
               "quoted maximum (only what the call uses is settled)"),
    "token": (lambda: _resigned(asset=OTHER), "permit2_token_mismatch",
              f"{WHERE}.permitted.token is not the quote's asset {USDC}; sign the quoted terms"),
}


@pytest.mark.parametrize("term", list(REFUSALS))
def test_what_every_facilitator_refuses_is_refused_locally_with_its_reason(term: str) -> None:
    make, reason, message = REFUSALS[term]
    payload, payer = make()
    assert payload_problem("upto", NETWORK, payload) is None  # well formed: wrong terms
    refused = local_refusal(payload, quote())
    assert refused == VerifyResponse(is_valid=False, invalid_reason=reason,
                                     invalid_message=message, payer=payer)
    assert sdk_verify(payload, quote()).invalid_reason == reason  # the facilitator's own answer


def test_the_deadline_margin_is_the_sdks() -> None:
    payload = signed(Account.create())
    deadline = int(payload["permit2Authorization"]["deadline"])
    assert local_refusal(payload, quote(), now=deadline - 6) is None
    refused = local_refusal(payload, quote(), now=deadline - 5)
    assert refused is not None and refused.invalid_reason == "permit2_deadline_expired"


def test_the_facilitator_checked_is_the_one_the_quote_names() -> None:
    extra = {k: v for k, v in quote().extra.items() if k != "facilitatorAddress"}
    payload, _ = _resigned(extra={**extra, "facilitatorAddress": OTHER})
    refused = local_refusal(payload, quote())
    assert refused is not None and refused.invalid_reason == "upto_facilitator_mismatch"
    assert local_refusal(payload, quote(extra={**extra, "facilitatorAddress": OTHER.lower()})) is None
    assert local_refusal(payload, quote(extra=extra)) is None  # a quote naming none: not checked


def test_a_signature_that_proves_nothing_is_left_to_the_facilitator() -> None:
    """Like exact's: a 65-byte signature recovering to another key may still be a smart wallet's
    (the facilitator asks the chain for code at `from`); it proves no payer either."""
    payer, stranger = Account.create(), Account.create()
    payload = signed(payer)
    assert proven_payer(payload, quote()) == payer.address.lower()
    forged = with_field(payload, "permit2Authorization.from", stranger.address)
    assert local_refusal(forged, quote()) is None
    assert proven_payer(forged, quote()) is None
    assert sdk_verify(forged, quote()).invalid_reason == "invalid_permit2_signature"  # an EOA's
    # A term changed after signing breaks the proof; a longer (contract wallet) signature proves
    # nothing either.
    assert proven_payer(with_field(payload, "permit2Authorization.nonce", "7"), quote()) is None
    assert proven_payer(with_field(payload, "signature", payload["signature"] + "00"), quote()) is None
    # Signed for another chain: Permit2's domain carries the chain id.
    other_chain = quote(network="eip155:8453", asset=BASE_SEPOLIA.usdc)
    assert proven_payer(payload, other_chain) is None


def test_an_unreadable_payload_is_no_verdict() -> None:
    """Called on a payload the shape check refused, the checks answer nothing rather than raise."""
    payload = with_field(signed(Account.create()), "permit2Authorization.nonce", str(2**256))
    assert payload_problem("upto", NETWORK, payload) == f"{WHERE}.nonce {UINT}"
    assert local_refusal(payload, quote()) is None
    assert proven_payer(payload, quote()) is None
    assert local_refusal({"permit2Authorization": {"witness": "x"}}, quote()) is None
