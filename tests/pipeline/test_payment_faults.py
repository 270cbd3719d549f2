"""The pipeline's payment rules under facilitator faults the live tests cannot produce on demand:
each test asserts the Outcome and the ledger rows (read through `Ledger`)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from agent.pipeline.outcomes import Delivered, PaymentDemanded, Refused
from agent.pipeline.shielding import SettleGuard, settle_guard
from skills.errors import UpstreamError
from skills.skill import Payload, SkillResult
from tests.support.fake_upstream import chat_answer
from tests.support.scripted_facilitator import (
    INSUFFICIENT_BALANCE,
    RECIPIENT_MISMATCH,
    TRANSACTION_FAILED,
    VALUE_MISMATCH,
    BroadcastThenTimeout,
    Hang,
    Invalid,
    Raises,
    SettleFails,
)

from .conftest import SocketUsed
from .harness import MODEL, PAY_TO, PAYER, Pipeline, echo, make_skill, payment_of

BODY = {"text": "hello"}
PRICE = 10_000  # echo's $0.01 in USDC's atomic units



def held_skill(pipeline: Pipeline, skill_id: str, *, times: int = 1
               ) -> tuple[asyncio.Event, asyncio.Event]:
    """A skill whose first `times` runs wait for `release` (after setting `entered`)."""
    entered, release = asyncio.Event(), asyncio.Event()
    runs = 0

    async def run(payload: Payload) -> SkillResult:
        nonlocal runs
        runs += 1
        if runs <= times:
            entered.set()
            await release.wait()
        return await echo(payload)

    pipeline.add(make_skill(skill_id, run))
    return entered, release


async def test_a_paid_call_delivers_settles_and_records_one_row(pipeline: Pipeline) -> None:
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Delivered)
    assert out.result.body == {"echo": BODY}
    assert out.receipt is not None and out.receipt.success and out.receipt.amount == str(PRICE)
    assert out.price_atomic == PRICE and out.receipt.payer == PAYER
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == out.receipt.transaction
    assert row["amount_atomic"] == PRICE and row["pay_to"] == PAY_TO and row["skill_id"] == "echo"
    assert row["payer"] == PAYER.lower() and row["usage"] == {"units": 1}
    assert row["latency_ms"] is not None
    fac = pipeline.facilitator
    assert (fac.verify_calls, fac.settle_calls, fac.broadcasts) == (1, 1, [out.receipt.transaction])


async def test_an_unpaid_call_is_quoted_and_nothing_is_verified_or_claimed(pipeline: Pipeline) -> None:
    out = await pipeline.call("echo", BODY)
    assert isinstance(out, PaymentDemanded) and out.reason is None
    [req] = out.required.accepts
    assert (req.amount, req.pay_to, req.network) == (str(PRICE), PAY_TO, "eip155:84532")
    assert out.required_v1.accepts[0].max_amount_required == str(PRICE)
    assert pipeline.facilitator.calls == [] and await pipeline.rows() == []


async def test_verify_raising_is_503_facilitator_unavailable_and_claims_nothing(
    pipeline: Pipeline,
) -> None:
    pipeline.facilitator.script_verify(Raises(ConnectionError("facilitator unreachable")))
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Refused)
    assert (out.status, out.code) == (503, "facilitator_unavailable")
    assert "ConnectionError" in out.message and "nothing was charged" in out.message
    assert await pipeline.rows() == [] and pipeline.facilitator.settle_calls == 0
    # nothing was claimed: the same payment pays once the facilitator is back
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    assert [r["state"] for r in await pipeline.rows()] == ["settled"]


async def test_verify_invalid_is_402_with_the_reason_and_claims_nothing(pipeline: Pipeline) -> None:
    reason = "invalid_exact_evm_insufficient_balance"
    pipeline.facilitator.script_verify(Invalid(reason))
    out = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    assert isinstance(out, PaymentDemanded)
    # (explained: payments/payer_mistakes.py; this harness has no chain RPC, so without figures)
    assert out.reason == reason and (out.message or "").startswith(f"payment rejected: {reason} (")
    assert out.required.error == out.message and out.required.accepts  # the quote, to pay again
    assert out.receipt is None
    assert await pipeline.rows() == [] and pipeline.facilitator.settle_calls == 0


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("value", "1", VALUE_MISMATCH),
    ("to", "0x000000000000000000000000000000000000dEaD", RECIPIENT_MISMATCH),
])
async def test_an_authorization_for_other_terms_is_refused_by_the_facilitators_checks(
    pipeline: Pipeline, field: str, value: str, reason: str,
) -> None:
    """`accepted` repeats the quote (so the pipeline's match passes); the signed authorization does
    not: only the facilitator can tell, and the scripted one checks as the SDK's does."""
    signed = await pipeline.signed("echo", BODY)
    signed["payload"]["authorization"][field] = value
    out = await pipeline.call("echo", BODY, payment_of(signed))
    assert isinstance(out, PaymentDemanded) and out.reason == reason
    assert await pipeline.rows() == []


async def test_a_settlement_refused_before_broadcast_withholds_the_result_and_releases(
    pipeline: Pipeline,
) -> None:
    """The facilitator checks the payment again at settle time and refuses it (the payer's
    balance went meanwhile): nothing was broadcast, so nothing is charged and the row is released."""
    runs = 0

    async def run(payload: Payload) -> SkillResult:
        nonlocal runs
        runs += 1
        return SkillResult(body={"secret": "the result"})

    pipeline.add(make_skill("counted", run))
    pipeline.facilitator.script_settle(SettleFails(INSUFFICIENT_BALANCE))
    payment = await pipeline.pay("counted", BODY)
    out = await pipeline.call("counted", BODY, payment)
    assert runs == 1  # it ran; its result is not handed out
    assert isinstance(out, PaymentDemanded) and not hasattr(out, "result")
    assert out.reason == INSUFFICIENT_BALANCE and "withheld" in (out.message or "")
    assert "nothing was charged" in (out.message or "")
    assert out.receipt is not None and not out.receipt.success
    row = await pipeline.row()
    assert (row["state"], row["error"], row["tx_hash"]) == ("released", INSUFFICIENT_BALANCE, None)
    assert pipeline.facilitator.broadcasts == []
    # Nothing moved: the same signed payment pays a retry (the balance is back).
    again = await pipeline.call("counted", BODY, payment)
    assert isinstance(again, Delivered) and again.result.body == {"secret": "the result"}
    assert runs == 2 and (await pipeline.row())["state"] == "settled"


async def test_a_settlement_failure_of_unknown_effect_is_pending_never_nothing_charged(
    pipeline: Pipeline,
) -> None:
    """A remote facilitator's `transaction_failed` with no transaction may follow a send that
    reached the chain: the payer is told to retry with the same payment, the row is pending."""
    pipeline.facilitator.script_settle(SettleFails(TRANSACTION_FAILED))
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Refused) and (out.status, out.code) == (503, "settlement_pending")
    assert "same payment" in out.message and "nothing was charged" not in out.message
    assert out.retry_after == pipeline.gateway.policy.pending_retry_seconds
    assert out.receipt is not None and out.receipt.error_reason == "settlement_pending"
    assert (await pipeline.row())["state"] == "pending"


async def test_a_settlement_that_raises_after_broadcasting(pipeline: Pipeline) -> None:
    """The facilitator sent the transaction, then timed out waiting for it: the money moved.
    The answer is pending (never "nothing was charged"); once the row's lease runs out, a retry
    with the same payment has the reconciler ask the chain, and gets the kept result."""
    pipeline.facilitator.script_settle(BroadcastThenTimeout())
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Refused) and out.code == "settlement_pending"
    assert len(pipeline.facilitator.broadcasts) == 1  # it did go out
    row = await pipeline.row()
    assert row["state"] == "pending" and "TimeoutError" in row["error"]
    # While the lease holds, a retry is told to wait.
    again = await pipeline.call("echo", BODY, payment)
    assert isinstance(again, Refused) and again.code == "settlement_pending"
    assert again.retry_after is not None and 1 <= again.retry_after <= 5
    await pipeline.expire_leases()
    delivered = await pipeline.call("echo", BODY, payment)
    assert isinstance(delivered, Delivered) and delivered.result.body == {"echo": BODY}
    assert delivered.receipt is not None
    assert delivered.receipt.transaction == pipeline.facilitator.broadcasts[0]
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == pipeline.facilitator.broadcasts[0]
    assert pipeline.facilitator.settle_calls == 1 and len(await pipeline.rows()) == 1
    [event] = await pipeline.ledger.events(row["id"])
    assert (event["from_state"], event["to_state"]) == ("pending", "settled")


async def test_a_caller_cancelled_while_settlement_hangs_lets_it_finish(pipeline: Pipeline) -> None:
    gate = Hang()
    pipeline.facilitator.script_settle(gate)
    payment = await pipeline.pay("echo", BODY)
    call = asyncio.create_task(pipeline.call("echo", BODY, payment))
    await gate.reached.wait()
    call.cancel()
    assert (await pipeline.row())["state"] == "settling"  # (the loop delivered the cancellation)
    assert not call.done()  # still waiting for its settlement, not abandoning it
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == pipeline.facilitator.broadcasts[0]


async def test_a_skill_that_raises_releases_the_claim_and_the_same_payment_pays_a_retry(
    pipeline: Pipeline,
) -> None:
    runs = 0

    async def flaky(payload: Payload) -> SkillResult:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("boom")
        return await echo(payload)

    pipeline.add(make_skill("flaky", flaky))
    payment = await pipeline.pay("flaky", BODY)
    out = await pipeline.call("flaky", BODY, payment)
    assert isinstance(out, Refused) and (out.status, out.code) == (500, "skill_failed")
    assert "nothing was charged" in out.message
    row = await pipeline.row()
    assert (row["state"], row["error"]) == ("released", "RuntimeError: boom")
    assert pipeline.facilitator.settle_calls == 0

    retried = await pipeline.call("flaky", BODY, payment)
    assert isinstance(retried, Delivered)
    [again] = await pipeline.rows()
    assert again["id"] == row["id"] and again["state"] == "settled" and again["error"] is None
    assert (pipeline.facilitator.verify_calls, pipeline.facilitator.settle_calls) == (2, 1)


async def test_an_upstream_failure_releases_the_claim_and_the_retry_pays(pipeline: Pipeline) -> None:
    """A model skill over the fake upstream: the provider fails, then answers."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
    pipeline.upstream.reply("/chat/completions", UpstreamError("every upstream failed (down)"),
                            chat_answer("Hello!"))
    payment = await pipeline.pay(MODEL, body)
    out = await pipeline.call(MODEL, body, payment)
    assert isinstance(out, Refused) and (out.status, out.code) == (502, "upstream_error")
    assert (await pipeline.row())["state"] == "released"

    retried = await pipeline.call(MODEL, body, payment)
    assert isinstance(retried, Delivered)
    assert retried.result.body["choices"][0]["message"]["content"] == "Hello!"
    assert retried.result.body["model"] == MODEL
    row = await pipeline.row()
    assert row["state"] == "settled" and row["usage"]["provider"] == "openai"
    assert row["usage"]["prompt_tokens"] == 9 and row["upstream_cost_usd"] is not None
    sent = pipeline.upstream.sent[-1]
    assert sent.body["model"] == MODEL and sent.body["max_tokens"] == 16
    assert sent.body["stream"] is False and sent.target.api_key == "sk-fake"


async def test_the_same_payment_twice_concurrently_one_claim_wins(pipeline: Pipeline) -> None:
    entered, release = held_skill(pipeline, "held")
    payment = await pipeline.pay("held", BODY)
    first = asyncio.create_task(pipeline.call("held", BODY, payment))
    await entered.wait()  # the first call holds the claim and is running
    second = await pipeline.call("held", BODY, payment)
    assert isinstance(second, Refused) and (second.status, second.code) == (409, "payment_in_progress")
    assert second.retry_after is not None and "same payment" in second.message
    release.set()
    assert isinstance(await first, Delivered)
    assert [r["state"] for r in await pipeline.rows()] == ["settled"]
    assert (pipeline.facilitator.verify_calls, pipeline.facilitator.settle_calls) == (2, 1)


async def test_identical_payments_raced_deliver_once(pipeline: Pipeline) -> None:
    payment = await pipeline.pay("echo", BODY)
    outcomes = await asyncio.gather(*(pipeline.call("echo", BODY, payment) for _ in range(6)))
    delivered = [o for o in outcomes if isinstance(o, Delivered)]
    refused = [o for o in outcomes if not isinstance(o, Delivered)]
    # One settles; the others were told the call was running or settling, or (arriving after
    # it settled) got its kept result: one settlement whatever the interleaving.
    assert delivered and {o.receipt.transaction for o in delivered if o.receipt} == set(
        pipeline.facilitator.broadcasts)
    assert {(type(o).__name__, getattr(o, "code", None)) for o in refused} <= {
        ("Refused", "payment_in_progress"), ("Refused", "settlement_pending")}
    assert [r["state"] for r in await pipeline.rows()] == ["settled"]
    assert len(pipeline.facilitator.broadcasts) == 1


async def test_a_call_cancelled_while_it_runs_releases_its_claim(pipeline: Pipeline) -> None:
    entered, _never = held_skill(pipeline, "held")
    payment = await pipeline.pay("held", BODY)
    call = asyncio.create_task(pipeline.call("held", BODY, payment))
    await entered.wait()
    assert (await pipeline.row())["state"] == "claimed"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    row = await pipeline.row()
    assert (row["state"], row["error"]) == ("released", "cancelled before settlement")
    assert pipeline.facilitator.settle_calls == 0
    # nothing moved: the same payment pays the retry (the skill no longer holds)
    assert isinstance(await pipeline.call("held", BODY, payment), Delivered)
    assert (await pipeline.row())["state"] == "settled"


async def test_a_face_that_stopped_settlement_releases_the_claim(pipeline: Pipeline) -> None:
    guard = SettleGuard()
    assert guard.stop()
    token = settle_guard.set(guard)
    try:
        out = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    finally:
        settle_guard.reset(token)
    assert isinstance(out, Refused) and (out.status, out.code) == (503, "cancelled_before_settlement")
    row = await pipeline.row()
    assert (row["state"], row["error"]) == ("released", "cancelled before settlement")
    assert pipeline.facilitator.settle_calls == 0


def test_the_tier_opens_no_sockets() -> None:
    with pytest.raises(SocketUsed):
        socket.create_connection(("127.0.0.1", 9))
    with socket.socket() as sock, pytest.raises(SocketUsed):
        sock.connect(("127.0.0.1", 9))
