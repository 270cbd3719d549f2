"""A facilitator whose answers a test scripts, call by call (a `payments.facilitator_port.FacilitatorPort`).

It is not a chain: nothing is signed or mined. What it does check is what the pipeline relies on a
facilitator to check, the way the SDK's EVM `exact` facilitator does (scheme, network, recipient,
exact amount, time window; a nonce settled once cannot settle again), so a test that pays the wrong
terms is refused for the SDK's reason rather than waved through.

Each `verify` / `settle` call takes the next scripted step (`script_verify(...)`,
`script_settle(...)`), or the default (`Valid()` / `Settles()`) when none is left:

    facilitator.script_verify(Invalid("invalid_exact_evm_insufficient_balance"))
    facilitator.script_settle(Raises(ConnectionError("rpc down")))
    gate = Hang(); facilitator.script_settle(gate)   # await gate.reached.wait(); gate.release.set()
    facilitator.script_settle(BroadcastThenTimeout())

Counters: `verify_calls`, `settle_calls`, `broadcasts` (transactions "sent to the chain": a
settlement that landed, or one that timed out after broadcasting), `settled` (nonce -> tx).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
    SupportedKind,
    SupportedResponse,
    VerifyResponse,
)

from payments.chain_probe import CannotMove, StillOpen, Verdict
from payments.chain_probe import Moved as ChainMoved
from payments.facilitator_status import SettlementNotBroadcast
from payments.ledger import PaymentRow
from payments.networks import NetworkInfo, lookup_network
from payments.reconciler import chain_ref_of

# The SDK's reasons (x402.mechanisms.evm.constants), as its EVM facilitator answers them.
UNSUPPORTED_SCHEME = "unsupported_scheme"
NETWORK_MISMATCH = "network_mismatch"
RECIPIENT_MISMATCH = "invalid_exact_evm_payload_recipient_mismatch"
VALUE_MISMATCH = "invalid_exact_evm_payload_authorization_value_mismatch"
VALID_BEFORE_EXPIRED = "invalid_exact_evm_payload_authorization_valid_before"
VALID_AFTER_FUTURE = "invalid_exact_evm_payload_authorization_valid_after"
NONCE_ALREADY_USED = "invalid_exact_evm_nonce_already_used"
INSUFFICIENT_BALANCE = "invalid_exact_evm_insufficient_balance"
TRANSACTION_FAILED = "transaction_failed"

Payload = PaymentPayload | PaymentPayloadV1
Requirements = PaymentRequirements | PaymentRequirementsV1


@dataclass
class Call:
    """One call the facilitator received."""

    method: str  # "verify" | "settle"
    payload: Payload
    requirements: Requirements


# ---- steps -------------------------------------------------------------------------------------


class Step:
    """One scripted answer. `reached` is set when a call takes this step (a test may wait on it)."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()

    async def verify(self, fac: ScriptedFacilitator, call: Call) -> VerifyResponse:
        raise AssertionError(f"{type(self).__name__} is not a verify step")

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        raise AssertionError(f"{type(self).__name__} is not a settle step")


class Valid(Step):
    """Verify as the SDK would, as far as paywire relies on it: valid if the terms are paid."""

    async def verify(self, fac: ScriptedFacilitator, call: Call) -> VerifyResponse:
        return fac.check(call)


class Invalid(Step):
    """Verify refuses the payment for `reason` (an SDK reason string)."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__()
        self.reason, self.message = reason, message

    async def verify(self, fac: ScriptedFacilitator, call: Call) -> VerifyResponse:
        return VerifyResponse(is_valid=False, invalid_reason=self.reason,
                              invalid_message=self.message, payer=payer_of(call.payload))


class Raises(Step):
    """The facilitator itself fails (unreachable, a bug): the call raises `exc`."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    async def verify(self, fac: ScriptedFacilitator, call: Call) -> VerifyResponse:
        raise self.exc

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        raise self.exc


class Settles(Step):
    """Settlement lands: the payment is checked again (a nonce settles once), then "mined"."""

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        checked = fac.check(call)
        if not checked.is_valid:
            return fac.receipt(call, success=False, reason=checked.invalid_reason)
        tx = fac.broadcast(call)
        fac.settled[nonce_of(call.payload)] = tx
        return fac.receipt(call, success=True, tx=tx)


class SettleFails(Step):
    """Settlement is refused before anything is broadcast (e.g. the simulation reverts)."""

    def __init__(self, reason: str = TRANSACTION_FAILED, message: str | None = None) -> None:
        super().__init__()
        self.reason, self.message = reason, message

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        return fac.receipt(call, success=False, reason=self.reason, message=self.message)


class BroadcastThenTimeout(Step):
    """The facilitator broadcasts the transaction (it is in `broadcasts`, the nonce is spent), then
    times out waiting for its receipt: the money may well have moved, but the call raises."""

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        tx = fac.broadcast(call)
        fac.settled[nonce_of(call.payload)] = tx
        raise TimeoutError(f"no receipt for {tx}")


class NotBroadcast(Step):
    """The facilitator could not be reached, or refused before broadcasting: nothing moved."""

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        raise SettlementNotBroadcast("connection refused")


class Hang(Step):
    """Waits until the test sets `release`, then answers as `then` does (default: the default)."""

    def __init__(self, then: Step | None = None) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.then = then

    async def verify(self, fac: ScriptedFacilitator, call: Call) -> VerifyResponse:
        await self.release.wait()
        return await (self.then or Valid()).verify(fac, call)

    async def settle(self, fac: ScriptedFacilitator, call: Call) -> SettleResponse:
        await self.release.wait()
        return await (self.then or Settles()).settle(fac, call)


# ---- the facilitator ---------------------------------------------------------------------------


@dataclass
class ScriptedFacilitator:
    """Verifies and settles `exact` payments on `networks` (CAIP-2 ids) as scripted."""

    networks: Iterable[str] = ("eip155:84532",)
    fee_payer: str = "11111111111111111111111111111111"  # a Solana kind's extra (unused on EVM)
    verify_script: deque[Step] = field(default_factory=deque)
    settle_script: deque[Step] = field(default_factory=deque)
    calls: list[Call] = field(default_factory=list)
    broadcasts: list[str] = field(default_factory=list)
    settled: dict[str, str] = field(default_factory=dict)  # nonce -> transaction

    def __post_init__(self) -> None:
        self.networks = tuple(self.networks)
        self._infos: dict[str, NetworkInfo] = {n: lookup_network(n) for n in self.networks}

    # scripting
    def script_verify(self, *steps: Step) -> ScriptedFacilitator:
        self.verify_script.extend(steps)
        return self

    def script_settle(self, *steps: Step) -> ScriptedFacilitator:
        self.settle_script.extend(steps)
        return self

    @property
    def verify_calls(self) -> int:
        return sum(1 for c in self.calls if c.method == "verify")

    @property
    def settle_calls(self) -> int:
        return sum(1 for c in self.calls if c.method == "settle")

    # FacilitatorPort
    async def verify(self, payload: Payload, requirements: Requirements) -> VerifyResponse:
        call = Call("verify", payload, requirements)
        self.calls.append(call)
        step = self.verify_script.popleft() if self.verify_script else Valid()
        step.reached.set()
        return await step.verify(self, call)

    async def settle(self, payload: Payload, requirements: Requirements) -> SettleResponse:
        call = Call("settle", payload, requirements)
        self.calls.append(call)
        step = self.settle_script.popleft() if self.settle_script else Settles()
        step.reached.set()
        return await step.settle(self, call)

    def get_supported(self) -> SupportedResponse:
        kinds = []
        for caip2, info in self._infos.items():
            extra = {"feePayer": self.fee_payer} if info.family == "svm" else None
            kinds.append(SupportedKind(x402_version=2, scheme="exact", network=caip2, extra=extra))
            kinds.append(SupportedKind(x402_version=1, scheme="exact", network=info.v1_name,
                                       extra=extra))
        return SupportedResponse(kinds=kinds)

    # what a real facilitator checks (EVM `exact`, EIP-3009)
    def check(self, call: Call) -> VerifyResponse:
        payload, req = call.payload, call.requirements
        payer = payer_of(payload)

        def invalid(reason: str) -> VerifyResponse:
            return VerifyResponse(is_valid=False, invalid_reason=reason, payer=payer)

        scheme, network = payload.get_scheme(), payload.get_network()
        if scheme != "exact" or req.scheme != "exact":
            return invalid(UNSUPPORTED_SCHEME)
        if network != req.network:
            return invalid(NETWORK_MISMATCH)
        amount = (req.max_amount_required if isinstance(req, PaymentRequirementsV1) else req.amount)
        auth = payload.payload.get("authorization") or {}
        if str(auth.get("to", "")).lower() != req.pay_to.lower():
            return invalid(RECIPIENT_MISMATCH)
        if int(auth.get("value", -1)) != int(amount):
            return invalid(VALUE_MISMATCH)
        now = int(time.time())
        if int(auth.get("validBefore", 0)) < now + 6:
            return invalid(VALID_BEFORE_EXPIRED)
        if int(auth.get("validAfter", 0)) > now:
            return invalid(VALID_AFTER_FUTURE)
        if nonce_of(payload) in self.settled:
            return invalid(NONCE_ALREADY_USED)
        return VerifyResponse(is_valid=True, payer=payer)

    # the chain, as the reconciler asks it (payments/chain_probe.py's verdicts)
    async def ask(self, row: PaymentRow) -> Verdict:
        ref = chain_ref_of(row)
        tx = self.settled.get(str(ref.get("nonce", "")).lower())
        if tx is not None:
            return ChainMoved(tx)
        valid_before = str(ref.get("valid_before") or "")
        if valid_before.isdigit() and int(valid_before) <= int(time.time()):
            return CannotMove("authorization expired unused")
        return StillOpen("authorization unused and not expired")

    def broadcast(self, call: Call) -> str:
        tx = "0x" + hashlib.sha256(f"{nonce_of(call.payload)}:{len(self.broadcasts)}".encode()).hexdigest()
        self.broadcasts.append(tx)
        return tx

    def receipt(self, call: Call, *, success: bool, tx: str = "", reason: str | None = None,
                message: str | None = None) -> SettleResponse:
        network = call.requirements.network
        if isinstance(call.requirements, PaymentRequirementsV1):
            network = lookup_network(network).caip2
        return SettleResponse(success=success, error_reason=reason, error_message=message,
                              payer=payer_of(call.payload), transaction=tx, network=network)


def payer_of(payload: Payload) -> str:
    auth: dict[str, Any] = payload.payload.get("authorization") or {}
    return str(auth.get("from", ""))


def nonce_of(payload: Payload) -> str:
    auth: dict[str, Any] = payload.payload.get("authorization") or {}
    return str(auth.get("nonce", "")).lower()
