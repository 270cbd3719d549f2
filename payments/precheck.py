"""What the gateway can refuse about a payment without asking the facilitator: only what every
facilitator refuses, whoever the signer is.

It runs after `processor.match` (the payload's `accepted` terms are the quote's: network,
scheme, amount, asset, payTo) and `payload_shape` (the fields parse). What a client signs can
still differ from what it says it accepted, so this checks the signed terms, as the SDK's
`exact` facilitators do before any chain read, with the SDK's reasons:

EVM (EIP-3009, x402 v1 and v2), in the SDK's order:
- authorization.to is not the quote's payTo (`..._recipient_mismatch`);
- authorization.value is not the quoted amount (`..._authorization_value_mismatch`);
- validBefore is less than now + 6 s, the SDK's margin (`..._authorization_valid_before`);
- validAfter is in the future (`..._authorization_valid_after`);
- the signature carries the ERC-6492 suffix but is not an ERC-6492 wrapper: the SDK fails to
  parse it before it looks at the chain (`invalid_exact_evm_failed_to_verify_signature`).
A 65-byte signature that does not recover to `from` is NOT refused here: the SDK routes by the
code at `from` (an EIP-1271 smart wallet, or an EIP-7702 delegated account, validates its own
signatures), which only the chain can tell.

Solana (SPL TransferChecked):
- the transfer's mint is not the quoted asset (`..._mint_mismatch`), its destination is not the
  payTo's associated token account (`..._recipient_mismatch`), or it moves less than the quote
  (`..._amount_insufficient`);
- a signature the client placed (every one but the fee payer's, which the facilitator adds) does
  not verify over the message: the chain's signature check refuses the transaction whoever signed
  it (the SDK answers `transaction_simulation_failed` after its simulation; so does this).
The blockhash's age is not known without the chain: not checked.

EVM `upto` (a Permit2 PermitWitnessTransferFrom through the x402 upto proxy), in the order of the
SDK's `verify_upto_permit2`, with its reasons:
- spender is not the upto proxy (`invalid_permit2_spender`): Permit2 lets only the spender pull;
- witness.to is not the quote's payTo (`invalid_permit2_recipient_mismatch`);
- witness.facilitator is not the quote's extra.facilitatorAddress (`upto_facilitator_mismatch`):
  the proxy takes the settlement only from that address. (A facilitator holding several keys
  would take any of its own; a client that accepted this quote and signed another signed other
  terms than it accepted.)
- deadline is less than now + 6 s (`permit2_deadline_expired`), validAfter is in the future
  (`permit2_not_yet_valid`);
- permitted.amount is not the quoted maximum (`permit2_amount_mismatch`), permitted.token is not
  the quoted asset (`permit2_token_mismatch`).
As for EIP-3009, a signature that does not recover to `from` is left to the facilitator (it asks
the chain for code at `from`). The upto proxy also refuses a zero settlement and one above the
maximum: the amount settled is the gateway's own (at most the quote), never the payer's.

`proven_payer` says whether a payload proves who signed it (used to charge a payer's
refused-payment budget, payments/rate_limits.py, only for payments its key signed).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from eth_abi.exceptions import EncodingError
from eth_account.messages import encode_typed_data
from eth_utils import keccak
from solders.transaction import VersionedTransaction
from x402.mechanisms.evm import constants as evm
from x402.mechanisms.evm.batch_settlement.constants import PAYLOAD_TYPE_VOUCHER, SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.erc6492 import is_erc6492_signature, parse_erc6492_signature
from x402.mechanisms.evm.types import ExactEIP3009Authorization
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.mechanisms.evm.verify import verify_eoa_signature
from x402.mechanisms.svm import constants as svm
from x402.mechanisms.svm.utils import derive_ata, extract_transaction_info
from x402.schemas import PaymentRequirements, VerifyResponse

from .channels.wire import MalformedPayload, check_payload, read_payload
from .networks import lookup_network

VALID_BEFORE_MARGIN_SECONDS = 6  # the SDK's: validBefore must be at least this far ahead
DEADLINE_MARGIN_SECONDS = evm.PERMIT2_DEADLINE_BUFFER  # the same for a Permit2 deadline

wall_clock: Callable[[], float] = time.time  # the facilitator's clock is a wall clock too
# A payload these checks cannot read (e.g. a value out of an EIP-712 type's range): no verdict.
_UNREADABLE = (ValueError, IndexError, KeyError, TypeError, EncodingError)


def local_refusal(payload: dict[str, Any], requirement: PaymentRequirements,
                  now: float | None = None) -> VerifyResponse | None:
    """Why every facilitator would refuse this matched payment, as the verify answer one would
    give (`is_valid=False`, the SDK's reason, a message naming the field), or None."""
    moment = int(wall_clock() if now is None else now)
    try:
        if requirement.scheme == evm.SCHEME_UPTO:
            return _permit2_refusal(payload, requirement, moment)
        if requirement.scheme == SCHEME_BATCH_SETTLEMENT:
            return _channel_refusal(payload, requirement)
        if lookup_network(requirement.network).family == "evm":
            return _eip3009_refusal(payload, requirement, moment)
        return _solana_refusal(payload, requirement)
    except _UNREADABLE:  # not provable here: the facilitator says
        return None


def checked_in_full(payload: dict[str, Any], requirement: PaymentRequirements) -> bool:
    """Whether `local_refusal` finding nothing is the whole verification: a channel voucher from
    an ECDSA payer (the channel's balance is checked when it is reserved, against paywire's own
    read of the chain). Deposits, refunds and smart-wallet payers go to the facilitator."""
    if requirement.scheme != SCHEME_BATCH_SETTLEMENT:
        return False
    try:
        read = read_payload(payload)
    except MalformedPayload:
        return False
    return read.kind == PAYLOAD_TYPE_VOUCHER and read.config.signs_by_ecdsa


def _channel_refusal(payload: dict[str, Any], requirement: PaymentRequirements) -> VerifyResponse | None:
    """What a channel payment's own fields refuse: the id binds the config, the config pays this
    requirement, a deposit's size and method, an ECDSA payer's voucher signature."""
    read = read_payload(payload)
    refusal = check_payload(read, requirement, get_evm_chain_id(requirement.network))
    if refusal is None:
        return None
    return _refused(refusal.reason, refusal.message, read.config.payer)


def _refused(reason: str, message: str, payer: str) -> VerifyResponse:
    return VerifyResponse(is_valid=False, invalid_reason=reason, invalid_message=message, payer=payer)


def _eip3009_refusal(payload: dict[str, Any], requirement: PaymentRequirements,
                     now: int) -> VerifyResponse | None:
    auth = payload["authorization"]
    payer = str(auth["from"])
    if str(auth["to"]).lower() != requirement.pay_to.lower():
        return _refused(evm.ERR_RECIPIENT_MISMATCH, "payload.authorization.to is not the quote's "
                        f"payTo {requirement.pay_to}; sign the quoted terms", payer)
    if int(auth["value"]) != int(requirement.amount):
        return _refused(evm.ERR_AUTHORIZATION_VALUE_MISMATCH, "payload.authorization.value is "
                        f"{auth['value']}, the quote is {requirement.amount}; sign the quoted amount",
                        payer)
    if int(auth["validBefore"]) < now + VALID_BEFORE_MARGIN_SECONDS:
        return _refused(evm.ERR_VALID_BEFORE_EXPIRED, "payload.authorization.validBefore has passed "
                        f"(or is less than {VALID_BEFORE_MARGIN_SECONDS} s away); sign a new payment",
                        payer)
    if int(auth["validAfter"]) > now:
        return _refused(evm.ERR_VALID_AFTER_FUTURE, "payload.authorization.validAfter is in the "
                        "future; sign a payment valid now", payer)
    signature = bytes.fromhex(str(payload["signature"])[2:])
    if is_erc6492_signature(signature):
        try:
            parse_erc6492_signature(signature)
        except ValueError:
            return _refused(evm.ERR_FAILED_TO_VERIFY_SIGNATURE, "payload.signature ends with the "
                            "ERC-6492 suffix but is not an ERC-6492 wrapper", payer)
    return None


def _permit2_refusal(payload: dict[str, Any], requirement: PaymentRequirements,
                     now: int) -> VerifyResponse | None:
    auth = payload["permit2Authorization"]
    witness, permitted, payer = auth["witness"], auth["permitted"], str(auth["from"])
    where = "payload.permit2Authorization"
    if not _same_address(auth["spender"], evm.X402_UPTO_PERMIT2_PROXY_ADDRESS):
        return _refused(evm.ERR_PERMIT2_INVALID_SPENDER, f"{where}.spender is {auth['spender']}, "
                        "not the x402 upto Permit2 proxy "
                        f"{evm.X402_UPTO_PERMIT2_PROXY_ADDRESS}; sign the quoted terms", payer)
    if not _same_address(witness["to"], requirement.pay_to):
        return _refused(evm.ERR_PERMIT2_RECIPIENT_MISMATCH, f"{where}.witness.to is not the "
                        f"quote's payTo {requirement.pay_to}; sign the quoted terms", payer)
    facilitator = (requirement.extra or {}).get("facilitatorAddress")
    if facilitator is not None and not _same_address(witness["facilitator"], facilitator):
        return _refused(evm.ERR_UPTO_FACILITATOR_MISMATCH, f"{where}.witness.facilitator is not "
                        f"the quote's extra.facilitatorAddress {facilitator}: only that address "
                        "can settle it; sign the quoted terms", payer)
    if int(auth["deadline"]) < now + DEADLINE_MARGIN_SECONDS:
        return _refused(evm.ERR_PERMIT2_DEADLINE_EXPIRED, f"{where}.deadline has passed (or is "
                        f"less than {DEADLINE_MARGIN_SECONDS} s away); sign a new payment", payer)
    if int(witness["validAfter"]) > now:
        return _refused(evm.ERR_PERMIT2_NOT_YET_VALID, f"{where}.witness.validAfter is in the "
                        "future; sign a payment valid now", payer)
    if int(permitted["amount"]) != int(requirement.amount):
        return _refused(evm.ERR_PERMIT2_AMOUNT_MISMATCH, f"{where}.permitted.amount is "
                        f"{permitted['amount']}, the quoted maximum is {requirement.amount}; sign "
                        "the quoted maximum (only what the call uses is settled)", payer)
    if not _same_address(permitted["token"], requirement.asset):
        return _refused(evm.ERR_PERMIT2_TOKEN_MISMATCH, f"{where}.permitted.token is not the "
                        f"quote's asset {requirement.asset}; sign the quoted terms", payer)
    return None


def _same_address(a: Any, b: Any) -> bool:
    return str(a).lower() == str(b).lower()


def _solana_refusal(payload: dict[str, Any], requirement: PaymentRequirements
                    ) -> VerifyResponse | None:
    tx = VersionedTransaction.from_bytes(base64.b64decode(payload["transaction"]))
    info = extract_transaction_info(tx)
    if info is None:  # no TransferChecked: the facilitator says which instruction is wrong
        return None
    if info.mint != requirement.asset:
        return _refused(svm.ERR_MINT_MISMATCH, f"the transfer's mint is {info.mint}, the quote's "
                        f"asset is {requirement.asset}", info.payer)
    if info.destination_ata != _associated_account(requirement.pay_to, requirement.asset,
                                                   info.token_program):
        return _refused(svm.ERR_RECIPIENT_MISMATCH, "the transfer's destination is not the token "
                        f"account of the quote's payTo {requirement.pay_to}", info.payer)
    if info.amount < int(requirement.amount):
        return _refused(svm.ERR_AMOUNT_INSUFFICIENT, f"the transfer moves {info.amount}, the quote "
                        f"is {requirement.amount}; sign the quoted amount", info.payer)
    if not all(_client_signatures(tx)):
        return _refused(svm.ERR_SIMULATION_FAILED, "a signature in the transaction does not verify "
                        "over its message; sign the transaction again", info.payer)
    return None


def proven_payer(payload: dict[str, Any], requirement: PaymentRequirements) -> str | None:
    """The payer (normalized as the ledger keeps it) when the payload proves that its key signed
    it, else None: EVM, a 65-byte signature of the EIP-3009 authorization (`upto`: of the Permit2
    typed data) that recovers to `from` (a smart wallet's signature proves nothing here); Solana,
    the transfer's authority signed the transaction and every signature the client placed
    verifies."""
    try:
        if requirement.scheme == evm.SCHEME_UPTO:
            return _permit2_signer(payload, requirement)
        if lookup_network(requirement.network).family == "evm":
            return _eip3009_signer(payload, requirement)
        tx = VersionedTransaction.from_bytes(base64.b64decode(payload["transaction"]))
        info = extract_transaction_info(tx)
        if info is None:
            return None
        signers = [str(k) for k in tx.message.account_keys[:tx.message.header.num_required_signatures]]
        results = _client_signatures(tx)
        if info.payer in signers[1:] and all(results):
            return info.payer
        return None
    except _UNREADABLE:
        return None


def _eip3009_signer(payload: dict[str, Any], requirement: PaymentRequirements) -> str | None:
    auth = payload["authorization"]
    signature = bytes.fromhex(str(payload["signature"])[2:])
    extra = requirement.extra or {}
    if len(signature) != 65 or "name" not in extra or "version" not in extra:
        return None
    authorization = ExactEIP3009Authorization(
        from_address=str(auth["from"]), to=str(auth["to"]), value=str(auth["value"]),
        valid_after=str(auth["validAfter"]), valid_before=str(auth["validBefore"]),
        nonce=str(auth["nonce"]))
    digest = hash_eip3009_authorization(authorization, get_evm_chain_id(requirement.network),
                                        requirement.asset, extra["name"], extra["version"])
    if verify_eoa_signature(digest, signature, authorization.from_address):
        return authorization.from_address.lower()
    return None


def _permit2_signer(payload: dict[str, Any], requirement: PaymentRequirements) -> str | None:
    """`from`, when a 65-byte signature of the Permit2 typed data recovers to it: the digest
    Permit2 checks (its EIP-712 domain: name "Permit2", the chain id, its address), as the SDK's
    facilitator builds it from the same fields."""
    auth = payload["permit2Authorization"]
    signature = bytes.fromhex(str(payload["signature"])[2:])
    if len(signature) != 65:
        return None
    witness, permitted = auth["witness"], auth["permitted"]
    message = {
        "permitted": {"token": permitted["token"], "amount": int(permitted["amount"])},
        "spender": auth["spender"], "nonce": int(auth["nonce"]), "deadline": int(auth["deadline"]),
        "witness": {"to": witness["to"], "facilitator": witness["facilitator"],
                    "validAfter": int(witness["validAfter"])},
    }
    domain = {"name": "Permit2", "chainId": get_evm_chain_id(requirement.network),
              "verifyingContract": evm.PERMIT2_ADDRESS}
    typed = encode_typed_data(domain_data=domain, message_types=evm.UPTO_PERMIT2_WITNESS_TYPES,
                              message_data=message)
    digest = keccak(b"\x19" + typed.version + typed.header + typed.body)  # EIP-191 version 1
    if verify_eoa_signature(digest, signature, str(auth["from"])):
        return str(auth["from"]).lower()
    return None


def _client_signatures(tx: VersionedTransaction) -> list[bool]:
    """Whether each signature but the fee payer's (slot 0, the facilitator's) verifies."""
    return list(tx.verify_with_results())[1:]


@lru_cache(maxsize=256)
def _associated_account(owner: str, mint: str, token_program: str) -> str:
    return derive_ata(owner, mint, token_program)
