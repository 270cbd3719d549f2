"""The batch-settlement requirement a 402 offers: the SDK's server scheme builds it, its hooks off.

`x402ResourceServer` needs a registered scheme to build requirements from the facilitator's
supported kinds (`extra`: receiverAuthorizer, withdrawDelay, the token's EIP-712 name and version,
minDeposit), to check at startup that a facilitator can authorize claims when paywire holds no
authorizer key (`validate_facilitator_support`), and to route deposits, claims and refunds to the
facilitator. Its hooks are not run: they keep channel state in a synchronous storage and a
per-process reservation of their own (docs/notes/issue-23-channels.md §2, D2); paywire's channel
state is the ledger's (payments/channels/store.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from x402.mechanisms.evm.batch_settlement.server import (
    BatchSettlementEvmScheme,
    BatchSettlementEvmSchemeServerConfig,
)
from x402.mechanisms.evm.batch_settlement.types import AuthorizerSigner
from x402.schemas import PaymentRequirements

DEFAULT_WITHDRAW_DELAY_SECONDS = 3600  # not the SDK's 900: room to claim before a withdrawal (D6)


class ChannelScheme(BatchSettlementEvmScheme):
    """The SDK's server scheme for requirements and the facilitator's calls only: every hook the
    SDK's resource server would run (it looks them up by name and skips a None) is off."""

    before_verify = None
    after_verify = None
    on_verify_failure = None
    before_settle = None
    after_settle = None
    on_settle_failure = None
    on_verified_payment_canceled = None
    enrich_payment_required_response = None
    enrich_settlement_payload = None
    enrich_settlement_response = None


def channel_scheme(pay_to: str, *, withdraw_delay: int = DEFAULT_WITHDRAW_DELAY_SECONDS,
                   authorizer: AuthorizerSigner | None = None) -> ChannelScheme:
    """The scheme for one network's `pay_to`. `authorizer`: the receiver-authorizer key paywire
    signs claims and refunds with; None delegates that to a facilitator advertising one."""
    return ChannelScheme(pay_to, BatchSettlementEvmSchemeServerConfig(
        receiver_authorizer_signer=authorizer, withdraw_delay=withdraw_delay))


def priced(scheme: BatchSettlementEvmScheme, template: PaymentRequirements, amount: int, *,
           min_deposit: int | None = None) -> PaymentRequirements:
    """`template` (a batch-settlement requirement built once) for a call priced `amount` (atomic):
    its `extra.minDeposit` follows the amount by the SDK's own rule (`max(amount, min_deposit)`,
    or 10 x amount without one), since `extra` is matched as a subset when a payment comes back."""
    extra = {k: v for k, v in (template.extra or {}).items() if k != "minDeposit"}
    if min_deposit is not None:
        extra["minDeposit"] = str(min_deposit)  # the operator's floor, atomic (the SDK's override)
    requirement = template.model_copy(update={"amount": str(amount), "extra": extra})
    extra["minDeposit"] = scheme.resolve_min_deposit_hint(requirement)
    return requirement


@dataclass(frozen=True)
class ChannelTerms:
    """The operator's channel settings the 402 carries: the receiver-authorizer key paywire signs
    claims and refunds with, the withdrawal delay, the smallest deposit (atomic), and how a
    deposit moves the payer's tokens (`extra.assetTransferMethod`: "eip3009" or "permit2")."""

    authorizer: AuthorizerSigner
    withdraw_delay: int = DEFAULT_WITHDRAW_DELAY_SECONDS
    min_deposit_atomic: int | None = None
    deposit_method: str = "eip3009"
