"""x402 `batch-settlement` on the wire: the payloads a payer sends, checked locally; the voucher's
EIP-712 digest and its signer, computed without the SDK's typed-data machinery; the corrective
requirement and the receipt fields the SDK's client reads.

A malformed payload is the payer's mistake, refused here naming the field (the SDK's parts assume
well-formed fields and raise on anything else). Amounts are bounded to 2**63 - 1: the ledger
holds them as 64-bit integers, while the contract's are uint128.

Speed: the SDK's local verify costs ~0.9 ms of CPU per voucher (docs/notes/issue-23-channels.md
§1.4: the channel id computed twice and a typed-data recovery through eth_account). The same
digests are a few keccaks over fixed-width words here, and the signer is recovered by coincurve;
tests/test_channel_wire.py holds them equal to the SDK's on every vector. The signature rule is
the contract's (payments/devnet/contracts/SignatureCheck.sol, OpenZeppelin's): 65 bytes, v 27 or
28, s in the lower half of the curve order. The SDK's recovery also takes v 0/1 and a high s, which
the contract refuses: a voucher it would accept could never be claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from coincurve import PublicKey
from eth_hash.auto import keccak
from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    BATCH_SETTLEMENT_DOMAIN_NAME,
    BATCH_SETTLEMENT_DOMAIN_VERSION,
    CHANNEL_CONFIG_TYPEHASH,
    MAX_WITHDRAW_DELAY,
    MIN_WITHDRAW_DELAY,
    PAYLOAD_TYPE_DEPOSIT,
    PAYLOAD_TYPE_REFUND,
    PAYLOAD_TYPE_VOUCHER,
)
from x402.schemas import PaymentRequirements, SettleResponse

# The field patterns every payload check shares (one place for each rule).
from ..payload_shape import _ADDRESS, _NONCE, _SIGNATURE, _UINT256_RULE, _is_uint256, _matches

MAX_ATOMIC = 2**63 - 1  # the ledger's BIGINT
KINDS = (PAYLOAD_TYPE_DEPOSIT, PAYLOAD_TYPE_VOUCHER, PAYLOAD_TYPE_REFUND)
ZERO_ADDRESS = "0x" + "0" * 40

_DOMAIN_TYPEHASH = keccak(
    b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
_VOUCHER_TYPEHASH = keccak(b"Voucher(bytes32 channelId,uint128 maxClaimableAmount)")
_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0  # secp256k1 n / 2


class MalformedPayload(ValueError):
    """The payload is not a batch-settlement payload: the message names the field."""


@dataclass(frozen=True)
class Refusal:
    """Why a channel payment is refused: the SDK's reason code (what its client acts on) and a
    message naming the field and how to fix it."""

    reason: str
    message: str
    retry_after: float | None = None  # channel_busy: when the call holding it ends, at the latest


@dataclass(frozen=True)
class ChannelConfig:
    """The channel's identity as the payer signed it; addresses in lower case."""

    payer: str
    payer_authorizer: str
    receiver: str
    receiver_authorizer: str
    token: str
    withdraw_delay: int
    salt: str  # 0x + 64 hex digits, lower case

    @property
    def signs_by_ecdsa(self) -> bool:
        """Vouchers are ECDSA signatures of `payer_authorizer`, checked locally; a zero one means
        the payer's own ERC-1271 wallet signs, which only a chain read (the facilitator) checks."""
        return self.payer_authorizer != ZERO_ADDRESS

    def columns(self) -> dict[str, Any]:
        """As paywire_channels stores it."""
        return {"payer": self.payer, "payer_authorizer": self.payer_authorizer,
                "receiver": self.receiver, "receiver_authorizer": self.receiver_authorizer,
                "token": self.token, "withdraw_delay": self.withdraw_delay, "salt": self.salt}


@dataclass(frozen=True)
class Voucher:
    channel_id: str  # lower case
    ceiling: int  # maxClaimableAmount: the running total the payer allows the receiver to claim
    signature: str = field(repr=False)  # a bearer allowance: never logged


@dataclass(frozen=True)
class ChannelPayload:
    """A batch-settlement payload, read: a deposit (with its voucher), a voucher, or a refund."""

    kind: str
    config: ChannelConfig
    voucher: Voucher
    deposit_amount: int | None = None  # deposit: what it adds to the channel
    transfer_method: str | None = None  # deposit: "eip3009" or "permit2"
    refund_amount: int | None = None  # refund: a partial refund's amount (None: all that is left)


@dataclass(frozen=True)
class Onchain:
    """The chain's view of a channel (paywire's own reads: `channels(id)`, `pendingWithdrawals(id)`'s
    initiatedAt, `refundNonce(id)`)."""

    balance: int
    total_claimed: int
    withdraw_requested_at: int = 0
    refund_nonce: int = 0

    def __post_init__(self) -> None:
        for name in ("balance", "total_claimed", "withdraw_requested_at", "refund_nonce"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_ATOMIC:
                raise ValueError(f"the chain's {name} {value} is outside 0..2**63-1, what the "
                                 "ledger holds: the channel cannot be kept")


# -- reading a payload --------------------------------------------------------------------------

_ADDR, _B32, _SIG, _UINT, _AMOUNT, _DELAY = "address", "bytes32", "signature", "uint", "amount", "delay"
_RULES = {
    _ADDR: "must be an address (0x + 40 hex digits)",
    _B32: "must be 32 bytes (0x + 64 hex digits)",
    _SIG: "must be a hex signature (0x + at least 65 bytes)",
    _UINT: _UINT256_RULE,
    _AMOUNT: (f"must be a whole number of the token's atomic units, at most {MAX_ATOMIC} (2**63 - 1, "
              "what paywire's ledger holds)"),
    _DELAY: "must be a whole number of seconds below 2**40 (a uint40)",
}
_CONFIG = (("payer", _ADDR), ("payerAuthorizer", _ADDR), ("receiver", _ADDR),
           ("receiverAuthorizer", _ADDR), ("token", _ADDR), ("withdrawDelay", _DELAY),
           ("salt", _B32))
_VOUCHER = (("channelId", _B32), ("maxClaimableAmount", _AMOUNT), ("signature", _SIG))
_ERC3009 = (("validAfter", _UINT), ("validBefore", _UINT), ("salt", _B32), ("signature", _SIG))
_PERMIT2 = (("from", _ADDR), ("permitted", (("token", _ADDR), ("amount", _AMOUNT))),
            ("spender", _ADDR), ("nonce", _UINT), ("deadline", _UINT),
            ("witness", (("channelId", _B32),)), ("signature", _SIG))
_METHODS = {"erc3009Authorization": ("eip3009", _ERC3009), "permit2Authorization": ("permit2", _PERMIT2)}


def _whole(value: Any, limit: int) -> int | None:
    """A whole number as the SDK reads it (int() of decimal digits, or a JSON integer) in
    0..limit, else None."""
    if isinstance(value, str) and _is_uint256(value):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        return None
    return number if 0 <= number <= limit else None


def _valid(kind: str, value: Any) -> bool:
    if kind == _ADDR:
        return _matches(_ADDRESS, value)
    if kind == _B32:
        return _matches(_NONCE, value)
    if kind == _SIG:
        return _matches(_SIGNATURE, value)
    if kind == _UINT:
        return _is_uint256(value)
    return _whole(value, MAX_ATOMIC if kind == _AMOUNT else 2**40 - 1) is not None


def _fields_problem(obj: Any, fields: tuple[Any, ...], where: str) -> str | None:
    if not isinstance(obj, dict):
        return f"{where} must be an object"
    for name, kind in fields:
        path = f"{where}.{name}"
        if isinstance(kind, tuple):
            problem = _fields_problem(obj.get(name), kind, path)
            if problem is not None:
                return problem
        elif not _valid(kind, obj.get(name)):
            return f"{path} {_RULES[kind]}"
    return None


def payload_problem(raw: Any) -> str | None:
    """Why `raw` (a PaymentPayload's `payload`) is not a batch-settlement payload, naming the field,
    or None when it is well formed."""
    if not isinstance(raw, dict):
        return "the payment's payload must be an object"
    kind = raw.get("type")
    if kind not in KINDS:
        return f"payload.type must be one of {', '.join(KINDS)} (the batch-settlement payloads)"
    problem = (_fields_problem(raw.get("channelConfig"), _CONFIG, "payload.channelConfig")
               or _fields_problem(raw.get("voucher"), _VOUCHER, "payload.voucher"))
    if problem is not None:
        return problem
    if kind == PAYLOAD_TYPE_DEPOSIT:
        return _deposit_problem(raw.get("deposit"))
    if kind == PAYLOAD_TYPE_REFUND and "amount" in raw and not _positive(raw["amount"]):
        return f"payload.amount (a partial refund) {_RULES[_AMOUNT]}, and more than 0"
    return None


def _positive(value: Any) -> bool:
    return bool(_whole(value, MAX_ATOMIC))


def _deposit_problem(deposit: Any) -> str | None:
    where = "payload.deposit"
    if not isinstance(deposit, dict):
        return f"{where} must be an object (a deposit's amount and authorization)"
    if not _positive(deposit.get("amount")):
        return f"{where}.amount {_RULES[_AMOUNT]}, and more than 0"
    auth = deposit.get("authorization")
    if not isinstance(auth, dict) or len([k for k in _METHODS if k in auth]) != 1:
        return (f"{where}.authorization must be an object holding exactly one of "
                "erc3009Authorization, permit2Authorization")
    name = next(k for k in _METHODS if k in auth)
    return _fields_problem(auth[name], _METHODS[name][1], f"{where}.authorization.{name}")


def read_payload(raw: Any) -> ChannelPayload:
    """The payload, read; MalformedPayload names the first field that is wrong."""
    problem = payload_problem(raw)
    if problem is not None:
        raise MalformedPayload(problem)
    cfg, voucher = raw["channelConfig"], raw["voucher"]
    config = ChannelConfig(
        payer=cfg["payer"].lower(), payer_authorizer=cfg["payerAuthorizer"].lower(),
        receiver=cfg["receiver"].lower(), receiver_authorizer=cfg["receiverAuthorizer"].lower(),
        token=cfg["token"].lower(), withdraw_delay=int(cfg["withdrawDelay"]), salt=cfg["salt"].lower())
    read = ChannelPayload(raw["type"], config, Voucher(
        voucher["channelId"].lower(), int(voucher["maxClaimableAmount"]), voucher["signature"]))
    if read.kind == PAYLOAD_TYPE_DEPOSIT:
        auth = raw["deposit"]["authorization"]
        method = next(_METHODS[k][0] for k in _METHODS if k in auth)
        return ChannelPayload(read.kind, config, read.voucher,
                              deposit_amount=int(raw["deposit"]["amount"]), transfer_method=method)
    if read.kind == PAYLOAD_TYPE_REFUND and "amount" in raw:
        return ChannelPayload(read.kind, config, read.voucher, refund_amount=int(raw["amount"]))
    return read


# -- digests and signatures ---------------------------------------------------------------------

def _address_word(address: str) -> bytes:
    return bytes(12) + bytes.fromhex(address[2:])


@lru_cache(maxsize=64)
def domain_separator(chain_id: int) -> bytes:
    """The batch-settlement contract's EIP-712 domain separator on `chain_id`."""
    return keccak(_DOMAIN_TYPEHASH + keccak(BATCH_SETTLEMENT_DOMAIN_NAME.encode())
                  + keccak(BATCH_SETTLEMENT_DOMAIN_VERSION.encode()) + chain_id.to_bytes(32, "big")
                  + _address_word(BATCH_SETTLEMENT_ADDRESS))


def channel_id_of(config: ChannelConfig, chain_id: int) -> str:
    """The channel's id: the EIP-712 digest of its config (the SDK's `compute_channel_id`)."""
    struct = keccak(CHANNEL_CONFIG_TYPEHASH + _address_word(config.payer)
                    + _address_word(config.payer_authorizer) + _address_word(config.receiver)
                    + _address_word(config.receiver_authorizer) + _address_word(config.token)
                    + config.withdraw_delay.to_bytes(32, "big") + bytes.fromhex(config.salt[2:]))
    return "0x" + keccak(b"\x19\x01" + domain_separator(chain_id) + struct).hex()


def voucher_digest(chain_id: int, channel_id: str, ceiling: int) -> bytes:
    """What a voucher's signature signs: the EIP-712 digest of Voucher(channelId, ceiling)."""
    struct = keccak(_VOUCHER_TYPEHASH + bytes.fromhex(channel_id[2:]) + ceiling.to_bytes(32, "big"))
    return keccak(b"\x19\x01" + domain_separator(chain_id) + struct)


def recover_signer(digest: bytes, signature: str) -> str | None:
    """The address (lower case) whose ECDSA signature of `digest` this is, by the contract's rule
    (65 bytes, v 27/28, s <= n/2), or None."""
    raw = bytes.fromhex(signature[2:]) if len(signature) == 132 else b""
    if len(raw) != 65 or raw[64] not in (27, 28) or int.from_bytes(raw[32:64], "big") > _HALF_N:
        return None
    try:
        key = PublicKey.from_signature_and_message(raw[:64] + bytes([raw[64] - 27]), digest, hasher=None)
    except ValueError:  # r or s zero or not below n: no key
        return None
    return "0x" + keccak(key.format(compressed=False)[1:])[-20:].hex()


# -- the local checks ---------------------------------------------------------------------------

def check_payload(payload: ChannelPayload, requirement: PaymentRequirements,
                  chain_id: int) -> Refusal | None:
    """What can be refused without the chain, the facilitator or the channel's row: the voucher
    names its config's channel; the config pays this requirement (receiver, authorizer, token,
    withdraw delay); a deposit reaches `extra.minDeposit` and uses the requirement's transfer
    method; an ECDSA payer's voucher is signed by its payerAuthorizer. An ERC-1271 payer's
    signature is left to the facilitator's verify (the spec's rule)."""
    refusal = _binding_refusal(payload, chain_id) or config_refusal(payload.config, requirement)
    if refusal is None and payload.kind == PAYLOAD_TYPE_DEPOSIT:
        refusal = _deposit_refusal(payload, requirement)
    if refusal is None and payload.config.signs_by_ecdsa:
        refusal = signature_refusal(payload, chain_id)
    return refusal


def _binding_refusal(payload: ChannelPayload, chain_id: int) -> Refusal | None:
    if channel_id_of(payload.config, chain_id) == payload.voucher.channel_id:
        return None
    return Refusal(bs.ERR_CHANNEL_ID_MISMATCH, (
        "payload.voucher.channelId is not the id of payload.channelConfig on this network: it "
        "must be the EIP-712 digest of the config (x402 batch-settlement domain)"))


def config_refusal(config: ChannelConfig, requirement: PaymentRequirements) -> Refusal | None:
    """Whether the channel pays this requirement (the SDK's `validate_channel_config`, but for the
    id, which `check_payload` binds)."""
    extra = requirement.extra or {}
    wanted = (
        ("receiver", config.receiver, requirement.pay_to, bs.ERR_RECEIVER_MISMATCH, "payTo"),
        ("receiverAuthorizer", config.receiver_authorizer, str(extra.get("receiverAuthorizer", "")),
         bs.ERR_RECEIVER_AUTHORIZER_MISMATCH, "extra.receiverAuthorizer"),
        ("token", config.token, requirement.asset, bs.ERR_TOKEN_MISMATCH, "asset"),
    )
    for name, have, want, reason, source in wanted:
        if have != want.lower():
            return Refusal(reason, f"payload.channelConfig.{name} must be the requirement's "
                                   f"{source} ({want}): open a channel to this receiver")
    delay = extra.get("withdrawDelay")
    if delay is not None and config.withdraw_delay != int(delay):
        return Refusal(bs.ERR_WITHDRAW_DELAY_MISMATCH, (
            f"payload.channelConfig.withdrawDelay must be the requirement's extra.withdrawDelay "
            f"({delay})"))
    if not MIN_WITHDRAW_DELAY <= config.withdraw_delay <= MAX_WITHDRAW_DELAY:
        return Refusal(bs.ERR_WITHDRAW_DELAY_OUT_OF_RANGE, (
            f"payload.channelConfig.withdrawDelay must be {MIN_WITHDRAW_DELAY} to "
            f"{MAX_WITHDRAW_DELAY} seconds (the contract's range)"))
    return None


def _deposit_refusal(payload: ChannelPayload, requirement: PaymentRequirements) -> Refusal | None:
    extra = requirement.extra or {}
    minimum = int(extra.get("minDeposit", 0))
    if payload.deposit_amount is not None and payload.deposit_amount < minimum:
        return Refusal(bs.ERR_DEPOSIT_BELOW_MIN_DEPOSIT, (
            f"payload.deposit.amount must be at least the requirement's extra.minDeposit "
            f"({minimum}): each deposit costs the receiver a transaction"))
    method = extra.get("assetTransferMethod") or "eip3009"
    if payload.transfer_method != method:
        reason = (bs.ERR_PERMIT2_AUTHORIZATION_REQUIRED if method == "permit2"
                  else bs.ERR_ERC3009_AUTHORIZATION_REQUIRED)
        name = "permit2Authorization" if method == "permit2" else "erc3009Authorization"
        return Refusal(reason, f"payload.deposit.authorization must hold {name} (the "
                               f"requirement's extra.assetTransferMethod is {method})")
    return None


def signature_refusal(payload: ChannelPayload, chain_id: int) -> Refusal | None:
    """Whether the voucher is payerAuthorizer's ECDSA signature of (channelId, ceiling)."""
    if not payload.config.signs_by_ecdsa:
        raise ValueError("an ERC-1271 payer's voucher (payerAuthorizer zero) is checked by the "
                         "facilitator's verify, not locally")
    voucher = payload.voucher
    signer = recover_signer(voucher_digest(chain_id, voucher.channel_id, voucher.ceiling),
                            voucher.signature)
    if signer == payload.config.payer_authorizer:
        return None
    return Refusal(bs.ERR_INVALID_VOUCHER_SIGNATURE, (
        "payload.voucher.signature is not payload.channelConfig.payerAuthorizer's signature of "
        "Voucher(channelId, maxClaimableAmount) (65 bytes, v 27 or 28, low s)"))


# -- what goes back -----------------------------------------------------------------------------

def channel_state(channel_id: str, onchain: Onchain, charged: int | None) -> dict[str, Any]:
    """`extra.channelState` of a receipt or a corrective requirement, as the SDK writes it;
    `charged` (chargedCumulativeAmount) left out when it is not known yet (a stream's headers)."""
    state: dict[str, Any] = {
        "channelId": channel_id, "balance": str(onchain.balance),
        "totalClaimed": str(onchain.total_claimed),
        "withdrawRequestedAt": onchain.withdraw_requested_at,
        "refundNonce": str(onchain.refund_nonce)}
    if charged is not None:
        state["chargedCumulativeAmount"] = str(charged)
    return state


def corrective_requirement(requirement: PaymentRequirements, *, channel_id: str, onchain: Onchain,
                           charged: int, signed_max: int | None,
                           signature: str | None) -> PaymentRequirements:
    """The batch-settlement requirement of a corrective 402 (the spec's; error
    `…_cumulative_amount_mismatch`): the channel's running total, and the latest voucher the
    payer signed, from which its client resyncs. Without a voucher yet, the client falls back to
    the chain's totalClaimed, which the running total then equals."""
    extra = dict(requirement.extra or {})
    extra["channelState"] = channel_state(channel_id, onchain, charged)
    if signed_max is not None and signature is not None:
        extra["voucherState"] = {"signedMaxClaimable": str(signed_max), "signature": signature}
    return requirement.model_copy(update={"extra": extra})


def charge_extra(channel_id: str, onchain: Onchain, *, charged_before: int,
                 actual: int) -> dict[str, Any]:
    """A receipt's `extra` once a call is charged: `chargedAmount` (the client adds it to its
    running total) and `channelState` whose chargedCumulativeAmount is the new total (the client
    checks the two agree)."""
    return {"channelState": channel_state(channel_id, onchain, charged_before + actual),
            "chargedAmount": str(actual)}


def voucher_receipt(*, network: str, payer: str, channel_id: str, onchain: Onchain,
                    charged_before: int, actual: int) -> SettleResponse:
    """The receipt of a voucher call: nothing went to the chain (`transaction` and `amount`
    empty), `actual` was charged on top of `charged_before`."""
    return SettleResponse(success=True, payer=payer.lower(), transaction="", network=network,
                          amount="", extra=charge_extra(channel_id, onchain,
                                                        charged_before=charged_before, actual=actual))
