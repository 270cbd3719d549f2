"""The ledger's database fails while a payment that may have moved is retried (in process: every
statement refused, as by a stopped server). The first answer the client gets is 503
`ledger_unavailable` with Retry-After, never a refusal: a 402 would have an x402 client sign a
second payment for a call it may already have paid. Once the database is back, the same payment
gets its result, charged once. (tests/faults/test_ledger_outage.py: PostgreSQL really stopped, on
both devnet chains.)"""

from __future__ import annotations

from agent.pipeline.outcomes import RETRY_AFTER_SECONDS, Delivered, Refused
from payments.controls import Controls
from tests.support.scripted_facilitator import NONCE_ALREADY_USED, BroadcastThenTimeout

from .harness import PAYER, Pipeline
from .test_abuse_limits import guard

BODY = {"text": "hello"}


def told_to_retry(out: object) -> None:
    """The answer while the ledger cannot be read: 503, Retry-After, no claim about charges."""
    assert isinstance(out, Refused), out
    assert (out.status, out.code, out.retry_after) == (503, "ledger_unavailable", RETRY_AFTER_SECONDS)
    assert "nothing was charged" not in out.message and "same payment" in out.message


async def test_a_settled_payment_retried_while_the_ledger_is_down_is_told_to_retry(
    pipeline: Pipeline,
) -> None:
    payment = await pipeline.pay("echo", BODY)
    first = await pipeline.call("echo", BODY, payment)
    assert isinstance(first, Delivered) and first.receipt is not None
    with pipeline.ledger_down():
        again = await pipeline.call("echo", BODY, payment)
    # the facilitator refused it (its nonce is spent); the ledger could not say it was ours
    assert pipeline.facilitator.check(pipeline.facilitator.calls[-1]).invalid_reason == NONCE_ALREADY_USED
    told_to_retry(again)
    back = await pipeline.call("echo", BODY, payment)
    assert isinstance(back, Delivered) and back.result.body == {"echo": BODY}
    assert back.receipt is not None and back.receipt.transaction == first.receipt.transaction
    assert pipeline.facilitator.settle_calls == 1


async def test_a_payment_that_landed_while_the_ledger_was_down_gets_its_result_once_it_is_back(
    pipeline: Pipeline,
) -> None:
    """The reported case: the chain slow (the settlement's outcome unknown: pending), the database
    stopped, the transfer lands, the payer retries: told to retry, never refused; with the
    database back, the reconciler finds the transfer and the retry gets the kept result."""
    pipeline.facilitator.script_settle(BroadcastThenTimeout())
    payment = await pipeline.pay("echo", BODY)
    pending = await pipeline.call("echo", BODY, payment)
    assert isinstance(pending, Refused) and pending.code == "settlement_pending"
    with pipeline.ledger_down():
        for _ in range(2):  # however often it is asked
            told_to_retry(await pipeline.call("echo", BODY, payment))
    await pipeline.expire_leases()  # (the pending row's retry time has come)
    back = await pipeline.call("echo", BODY, payment)
    assert isinstance(back, Delivered), back
    assert back.result.body == {"echo": BODY}
    assert back.receipt is not None and back.receipt.transaction == pipeline.facilitator.broadcasts[0]
    assert len(pipeline.facilitator.broadcasts) == 1
    assert (await pipeline.row())["state"] == "settled"


async def test_a_denied_payers_settled_payment_is_not_refused_while_the_ledger_is_down(
    pipeline: Pipeline,
) -> None:
    controls = Controls(pipeline.ledger.engine)
    guard(pipeline, controls=controls)
    payment = await pipeline.pay("echo", BODY)
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    await controls.deny_payer(PAYER, reason="abuse")
    with pipeline.ledger_down():
        # charged before the denial: it may be owed its result; the ledger cannot say
        told_to_retry(await pipeline.call("echo", BODY, payment))
    back = await pipeline.call("echo", BODY, payment)
    assert isinstance(back, Delivered) and back.result.body == {"echo": BODY}
    assert pipeline.facilitator.settle_calls == 1
