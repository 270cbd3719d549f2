"""The facilitator seam: what `PaymentProcessor` needs from a facilitator, and nothing more.

The x402 SDK's `x402ResourceServer` drives any object with these three methods (the SDK's own
`FacilitatorClient` protocol): `verify` and `settle` are awaited per payment, `get_supported` is
called synchronously by `x402ResourceServer.initialize()` when the processor starts, to learn the
(scheme, network) kinds it settles and their extras (Solana's fee payer). Implementations:
`ThreadedFacilitator` (the SDK's sync facilitator with our signers, in worker threads), the SDK's
`HTTPFacilitatorClient` (a remote facilitator), and the tests' `ScriptedFacilitator`.

A `verify` or `settle` that raises means the facilitator itself failed (the pipeline answers 503
or marks the settlement failed); a payment it refuses is an answer (`is_valid=False`,
`success=False`) with the SDK's reason.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
    SupportedResponse,
    VerifyResponse,
)


@runtime_checkable
class FacilitatorPort(Protocol):
    """Verifies and settles x402 payments; says which payment kinds it handles."""

    async def verify(
        self,
        payload: PaymentPayload | PaymentPayloadV1,
        requirements: PaymentRequirements | PaymentRequirementsV1,
    ) -> VerifyResponse:
        """Is this payment valid for these requirements (signature, amount, pay_to, time window,
        balance)? Moves nothing."""
        ...

    async def settle(
        self,
        payload: PaymentPayload | PaymentPayloadV1,
        requirements: PaymentRequirements | PaymentRequirementsV1,
    ) -> SettleResponse:
        """Move the money on chain; the receipt says whether it landed (and its transaction)."""
        ...

    def get_supported(self) -> SupportedResponse:
        """The payment kinds handled (x402 version, scheme, network, extra); synchronous because
        the SDK's `x402ResourceServer.initialize()` calls it so."""
        ...
