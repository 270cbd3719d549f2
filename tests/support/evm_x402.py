"""The x402 SDK's exact-EVM flow, as paywire runs it, for any chain that holds a USDC-like token.

A chain here is anything with the `EvmChain` surface: `EvmDevnet` itself (DevUSDC, or Circle's
FiatTokenV2_2 via `evm_circle.deploy_circle_usdc`) and `evm_anvil.AnvilUsdc`. The client is
the SDK's exact client scheme with an `EthAccountSigner`; the facilitator is the SDK's
`x402Facilitator` with `register_exact_evm_facilitator`.
"""

from __future__ import annotations

from typing import Any, Protocol

from eth_account.signers.local import LocalAccount
from x402 import x402Client, x402Facilitator
from x402.mechanisms.evm.exact import register_exact_evm_client, register_exact_evm_facilitator
from x402.mechanisms.evm.signer import FacilitatorEvmSigner
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements
from x402.schemas.v1 import PaymentPayloadV1, PaymentRequiredV1, PaymentRequirementsV1

NETWORK = "eip155:84532"
NETWORK_V1 = "base-sepolia"
# Base Sepolia USDC's EIP-712 domain, as a resource server advertises it in `extra`.
USDC_EXTRA = {"name": "USDC", "version": "2"}


class EvmChain(Protocol):
    """What the flow needs from a chain: a token to pay with and a facilitator to settle."""

    USDC_ADDRESS: str

    def mint(self, to: str, amount: int) -> str: ...

    def balance_of(self, address: str) -> int: ...

    def transfer(self, private_key: str, to: str, amount: int) -> str: ...

    def facilitator_signer(self) -> FacilitatorEvmSigner: ...


def quote(asset: str, pay_to: str, amount: int, *, max_timeout_seconds: int = 300) -> PaymentRequirements:
    """v2 requirements as paywire's resource server builds them for Base Sepolia."""
    return PaymentRequirements(
        scheme="exact",
        network=NETWORK,
        asset=asset,
        amount=str(amount),
        pay_to=pay_to,
        max_timeout_seconds=max_timeout_seconds,
        extra=dict(USDC_EXTRA),
    )


def quote_v1(asset: str, pay_to: str, amount: int) -> PaymentRequirementsV1:
    """The v1 form of the same quote (legacy clients sign validAfter = now - 600)."""
    return PaymentRequirementsV1(
        scheme="exact",
        network=NETWORK_V1,
        max_amount_required=str(amount),
        resource="http://127.0.0.1/test",
        description="test",
        mime_type="application/json",
        pay_to=pay_to,
        max_timeout_seconds=300,
        asset=asset,
        extra=dict(USDC_EXTRA),
    )


def new_client(payer: LocalAccount) -> x402Client:
    client = x402Client()
    register_exact_evm_client(client, EthAccountSigner(payer), networks=NETWORK)
    return client


async def sign_payment(payer: LocalAccount, requirements: PaymentRequirements) -> PaymentPayload:
    """The payer's client answers a 402 that offers exactly `requirements`."""
    payload = await new_client(payer).create_payment_payload(PaymentRequired(accepts=[requirements]))
    assert isinstance(payload, PaymentPayload)
    return payload


async def sign_payment_v1(payer: LocalAccount, requirements: PaymentRequirementsV1) -> PaymentPayloadV1:
    payload = await new_client(payer).create_payment_payload(PaymentRequiredV1(accepts=[requirements]))
    assert isinstance(payload, PaymentPayloadV1)
    return payload


def new_facilitator(signer: FacilitatorEvmSigner) -> x402Facilitator:
    facilitator = x402Facilitator()
    register_exact_evm_facilitator(facilitator, signer, networks=NETWORK)
    return facilitator


def authorization(payload: PaymentPayload) -> dict[str, Any]:
    """The EIP-3009 authorization inside an exact-EVM payload (mutable, for tampering)."""
    return payload.payload["authorization"]
