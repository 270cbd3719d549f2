"""The settlement state machine in the pipeline: a charged payer gets its result exactly once.

Retries carrying the same payment (or another payment under the same x402 payment identifier)
are answered from the ledger: the kept result, the pending state, or a fresh run when nothing
moved; a replica that died (its lease ran out) leaves nothing stuck. Each test reads the rows."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    append_payment_identifier_to_extensions,
)
from x402.schemas import PaymentPayload

from agent.pipeline.outcomes import Delivered, PaymentDemanded, Refused
from payments.ledger import ClaimRequest, PaymentState
from payments.processor import identify
from skills.skill import Payload, SkillResult
from tests.support.fake_upstream import FakeStream, chat_chunks
from tests.support.scripted_facilitator import (
    INSUFFICIENT_BALANCE,
    TRANSACTION_FAILED,
    BroadcastThenTimeout,
    NotBroadcast,
    Raises,
    SettleFails,
)

from .harness import MODEL, Pipeline, echo, make_skill, payment_of

BODY = {"text": "hello"}


def counted(pipeline: Pipeline, skill_id: str = "counted") -> list[Payload]:
    """A skill that records each run."""
    runs: list[Payload] = []

    async def run(payload: Payload) -> SkillResult:
        runs.append(payload)
        return SkillResult(body={"run": len(runs), "echo": payload}, usage={"units": 1})

    pipeline.add(make_skill(skill_id, run))
    return runs


async def signed_with_id(pipeline: Pipeline, skill_id: str, body: Payload, payment_id: str
                         ) -> dict[str, Any]:
    """A payment made by the SDK's own client, carrying an x402 payment identifier."""
    quote = await pipeline.call(skill_id, body)
    assert isinstance(quote, PaymentDemanded)
    assert PAYMENT_IDENTIFIER in (quote.required.extensions or {})  # offered in every 402
    extensions = append_payment_identifier_to_extensions(dict(quote.required.extensions or {}),
                                                         payment_id)
    signed = pipeline._client.create_payment_payload(quote.required, extensions=extensions)
    assert isinstance(signed, PaymentPayload)
    return signed.model_dump(by_alias=True, exclude_none=True)


async def test_a_retry_with_the_same_payment_gets_the_kept_result_and_no_second_charge(
    pipeline: Pipeline,
) -> None:
    runs = counted(pipeline)
    payment = await pipeline.pay("counted", BODY)
    first = await pipeline.call("counted", BODY, payment)
    assert isinstance(first, Delivered) and first.receipt is not None
    again = await pipeline.call("counted", BODY, payment)  # the answer was lost: the client retries
    assert isinstance(again, Delivered) and again.result.body == first.result.body
    assert again.receipt is not None and again.receipt.transaction == first.receipt.transaction
    assert again.receipt.amount == first.receipt.amount
    assert len(runs) == 1 and pipeline.facilitator.settle_calls == 1
    row = await pipeline.row()
    assert row["state"] == "settled" and row["delivered_at"] is not None


async def test_the_same_payment_for_a_different_request_is_refused(pipeline: Pipeline) -> None:
    payment = await pipeline.pay("echo", BODY)
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    other = await pipeline.call("echo", {"text": "other"}, payment)
    assert isinstance(other, PaymentDemanded) and other.reason in (
        "payment_already_used", "invalid_exact_evm_payload_authorization_value_mismatch")
    assert pipeline.facilitator.settle_calls == 1


async def test_a_payment_identifier_answers_a_resigned_payment_from_the_ledger(
    pipeline: Pipeline,
) -> None:
    runs = counted(pipeline)
    pid = "order-2026-11-24-000001"
    first = await pipeline.call("counted", BODY, payment_of(
        await signed_with_id(pipeline, "counted", BODY, pid)))
    assert isinstance(first, Delivered) and first.receipt is not None
    # The client lost the answer and signed a new payment for the same call, same identifier.
    second = await pipeline.call("counted", BODY, payment_of(
        await signed_with_id(pipeline, "counted", BODY, pid)))
    assert isinstance(second, Delivered) and second.result.body == first.result.body
    assert second.receipt is not None and second.receipt.transaction == first.receipt.transaction
    assert len(runs) == 1 and pipeline.facilitator.settle_calls == 1
    assert len(pipeline.facilitator.broadcasts) == 1  # the second payment never moved
    [row] = await pipeline.rows()
    assert row["payment_id"] == pid

    conflict = await pipeline.call("counted", {"text": "other"}, payment_of(
        await signed_with_id(pipeline, "counted", {"text": "other"}, pid)))
    assert isinstance(conflict, Refused) and (conflict.status, conflict.code) == (
        409, "payment_identifier_conflict")
    assert conflict.param == "extensions.payment-identifier.info.id"
    assert len(runs) == 1 and len(await pipeline.rows()) == 1


async def test_a_payment_identifier_whose_payment_moved_nothing_passes_to_the_new_payment(
    pipeline: Pipeline,
) -> None:
    runs = counted(pipeline)
    pid = "retry-after-release-0001"
    pipeline.facilitator.script_settle(NotBroadcast())
    out = await pipeline.call("counted", BODY, payment_of(
        await signed_with_id(pipeline, "counted", BODY, pid)))
    assert isinstance(out, PaymentDemanded) and "nothing was charged" in (out.message or "")
    out = await pipeline.call("counted", BODY, payment_of(
        await signed_with_id(pipeline, "counted", BODY, pid)))
    assert isinstance(out, Delivered)
    rows = await pipeline.rows()
    assert sorted((r["state"], r["payment_id"]) for r in rows) == [
        ("released", None), ("settled", pid)]
    assert len(runs) == 2 and len(pipeline.facilitator.broadcasts) == 1


async def test_a_malformed_payment_identifier_is_refused_before_anything(pipeline: Pipeline) -> None:
    signed = await signed_with_id(pipeline, "echo", BODY, "a-valid-identifier-1")
    signed["extensions"][PAYMENT_IDENTIFIER]["info"]["id"] = "short"
    out = await pipeline.call("echo", BODY, payment_of(signed))
    assert isinstance(out, Refused) and (out.status, out.code) == (400, "invalid_payment_identifier")
    assert out.param == "extensions.payment-identifier.info.id" and "16 to 128" in out.message
    assert pipeline.facilitator.calls == [] and await pipeline.rows() == []


async def test_a_facilitator_never_reached_releases_and_the_same_payment_pays_later(
    pipeline: Pipeline,
) -> None:
    pipeline.facilitator.script_settle(NotBroadcast())
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, PaymentDemanded) and "nothing was charged" in (out.message or "")
    assert (await pipeline.row())["state"] == "released"
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    assert (await pipeline.row())["state"] == "settled"


async def test_a_claim_whose_replica_died_is_taken_over_once_its_lease_ran_out(
    pipeline: Pipeline,
) -> None:
    """A replica claimed the payment and died while the call ran: nothing was broadcast."""
    runs = counted(pipeline)
    signed = await pipeline.signed("counted", BODY)
    payment = payment_of(signed)
    quote = await pipeline.call("counted", BODY)
    assert isinstance(quote, PaymentDemanded)
    matched = pipeline.gateway.processor.match(payment.payload, quote.required.accepts,
                                               pipeline.gateway.resource_info(
                                                   pipeline.registry.get("counted"), "x"))
    assert matched is not None
    from agent.pipeline.requests import request_digest
    await pipeline.ledger.claim(ClaimRequest(
        key=identify(matched).key, amount_atomic=10_000, asset=matched.requirement.asset,
        pay_to=matched.requirement.pay_to, skill_id="counted",
        request_digest=request_digest("counted", BODY)), owner="dead-replica", lease_seconds=60)
    busy = await pipeline.call("counted", BODY, payment)
    assert isinstance(busy, Refused) and (busy.status, busy.code) == (409, "payment_in_progress")
    assert busy.retry_after is not None and 1 <= busy.retry_after <= 60
    await pipeline.expire_leases()
    out = await pipeline.call("counted", BODY, payment)
    assert isinstance(out, Delivered) and len(runs) == 1
    row = await pipeline.row()
    assert row["state"] == "settled" and row["owner"] == pipeline.gateway.policy.owner


async def test_the_reconciler_settles_releases_and_leaves_open_what_the_chain_says(
    pipeline: Pipeline,
) -> None:
    # 1: broadcast, then the receipt never came (the money moved)
    pipeline.facilitator.script_settle(BroadcastThenTimeout())
    moved = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    assert isinstance(moved, Refused) and moved.code == "settlement_pending"
    # 2: a facilitator failure of unknown effect where nothing moved (still open on chain)
    pipeline.facilitator.script_settle(SettleFails(TRANSACTION_FAILED))
    body2 = {"text": "two"}
    open_ = await pipeline.call("echo", body2, await pipeline.pay("echo", body2))
    assert isinstance(open_, Refused) and open_.code == "settlement_pending"
    # 3: a claim left by a dead replica
    entered_at_claim = await pipeline.ledger.claim(ClaimRequest(
        key=identify_for(pipeline, "0x" + "77" * 32), amount_atomic=1, asset="0xasset",
        pay_to="0xpay", skill_id="echo", request_digest="d"), owner="dead", lease_seconds=60)
    assert entered_at_claim

    await pipeline.expire_leases()
    tally = await pipeline.reconciler.run_once()
    assert (tally.settled, tally.released, tally.still_open) == (1, 1, 1)
    states = sorted(r["state"] for r in await pipeline.rows())
    assert states == ["pending", "released", "settled"]
    settled = (await pipeline.rows(state="settled"))[0]
    assert settled["tx_hash"] == pipeline.facilitator.broadcasts[0]
    events = await pipeline.ledger.events()
    assert sorted((e["from_state"], e["to_state"]) for e in events) == [
        ("claimed", "released"), ("pending", "settled")]
    # A second pass (another replica, or later) asks again about the open one only: it was handed
    # back at once (so a retry of its payment can settle it again); the others are finished.
    again = await pipeline.reconciler.run_once()
    assert (again.settled, again.released, again.still_open) == (0, 0, 1)


def identify_for(pipeline: Pipeline, nonce: str) -> Any:
    from payments.ledger import PaymentKey

    return PaymentKey(network="eip155:84532", payer="0x" + "11" * 20, nonce=nonce)


async def test_a_ledger_failure_after_settlement_still_delivers_and_is_reconciled(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The money moved, then the database went away: the payer still gets its result; the row
    keeps its intent and the reconciler records the settlement once its lease runs out."""
    async def down(*args: Any, **kwargs: Any) -> bool:
        raise OperationalError("UPDATE", {}, ConnectionRefusedError("database is down"))

    monkeypatch.setattr(pipeline.ledger, "mark_settled", down)
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Delivered) and out.result.body == {"echo": BODY}
    assert (await pipeline.row())["state"] == "settling"
    monkeypatch.undo()
    await pipeline.expire_leases()
    await pipeline.reconciler.run_once()
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == out.receipt.transaction  # type: ignore[union-attr]
    # The kept result answers the payer's retry; nothing is charged twice.
    again = await pipeline.call("echo", BODY, payment)
    assert isinstance(again, Delivered) and again.result.body == out.result.body
    assert pipeline.facilitator.settle_calls == 1


async def test_a_ledger_down_at_the_claim_refuses_and_charges_nothing(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("INSERT", {}, ConnectionRefusedError("database is down"))

    monkeypatch.setattr(pipeline.ledger, "claim", down)
    out = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    assert isinstance(out, Refused) and (out.status, out.code) == (503, "ledger_unavailable")
    assert "never charged twice" in out.message and out.retry_after
    assert pipeline.facilitator.settle_calls == 0


async def test_a_result_too_large_to_keep_is_not_replayed_once_delivered(pipeline: Pipeline) -> None:
    pipeline.gateway.policy = type(pipeline.gateway.policy)(
        owner=pipeline.gateway.policy.owner, keep_result_max_bytes=0)
    payment = await pipeline.pay("echo", BODY)
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    again = await pipeline.call("echo", BODY, payment)
    assert isinstance(again, PaymentDemanded) and again.reason == "payment_already_used"
    assert "delivered" in (again.message or "")


async def test_a_stream_cut_before_it_was_delivered_is_run_again_for_free(pipeline: Pipeline) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16,
            "stream": True}
    for _ in range(2):
        pipeline.upstream.reply_stream("/chat/completions", FakeStream(chat_chunks("Hel", "lo")))
    payment = await pipeline.pay(MODEL, body)
    out = await pipeline.call(MODEL, body, payment, stream=True)
    assert isinstance(out, Delivered) and out.stream is not None
    await out.stream.__anext__()
    await out.stream.aclose()  # type: ignore[attr-defined]  # the client's connection dropped
    await pipeline.bookkeeping_done()
    row = await pipeline.row()
    assert row["state"] == "settled" and row["usage"]["delivery"] == "partial"
    assert row["delivered_at"] is None
    again = await pipeline.call(MODEL, body, payment, stream=True)
    assert isinstance(again, Delivered) and again.stream is not None
    chunks = [chunk async for chunk in again.stream]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello"
    assert pipeline.facilitator.settle_calls == 1
    assert (await pipeline.row())["delivered_at"] is None  # until the face says it reached the payer
    again.handed_over(True)
    await pipeline.bookkeeping_done()
    # Delivered now: a third ask gets no third run.
    third = await pipeline.call(MODEL, body, payment, stream=True)
    assert isinstance(third, PaymentDemanded) and third.reason == "payment_already_used"


async def test_a_retry_settles_again_what_never_reached_the_chain(pipeline: Pipeline) -> None:
    """The facilitator timed out before broadcasting (unknown to paywire); the replica's lease
    ran out; the chain says the authorization is unused and valid. The payer's retry with the
    same payment settles it again (once), and gets the result kept with the intent."""
    runs = counted(pipeline)
    pipeline.facilitator.script_settle(Raises(TimeoutError("facilitator did not answer")))
    payment = await pipeline.pay("counted", BODY)
    out = await pipeline.call("counted", BODY, payment)
    assert isinstance(out, Refused) and out.code == "settlement_pending"
    assert pipeline.facilitator.broadcasts == [] and (await pipeline.row())["state"] == "pending"
    await pipeline.expire_leases()
    again = await pipeline.call("counted", BODY, payment)
    assert isinstance(again, Delivered) and again.result.body == {"run": 1, "echo": BODY}
    assert again.receipt is not None and again.receipt.transaction == pipeline.facilitator.broadcasts[0]
    assert len(runs) == 1 and pipeline.facilitator.settle_calls == 2
    assert len(pipeline.facilitator.broadcasts) == 1
    row = await pipeline.row()
    assert row["state"] == "settled" and row["tx_hash"] == pipeline.facilitator.broadcasts[0]


async def test_a_settle_again_that_is_refused_stays_pending(pipeline: Pipeline) -> None:
    """A refusal when settling again may mean the first broadcast landed meanwhile: never
    'nothing moved' then."""
    pipeline.facilitator.script_settle(Raises(TimeoutError("no answer")),
                                       SettleFails(INSUFFICIENT_BALANCE))
    payment = await pipeline.pay("echo", BODY)
    assert (await pipeline.call("echo", BODY, payment)).code == "settlement_pending"  # type: ignore[union-attr]
    await pipeline.expire_leases()
    again = await pipeline.call("echo", BODY, payment)
    assert isinstance(again, Refused) and again.code == "settlement_pending"
    assert (await pipeline.row())["state"] == "pending"


async def test_a_release_the_ledger_could_not_write_is_not_answered_nothing_charged(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing moved, but the ledger is down: the payer is told to retry later (not "send it
    again now"), and the release is written once the ledger is back."""
    release = pipeline.ledger.release
    failures = 1

    async def flaky(*args: Any, **kwargs: Any) -> bool:
        nonlocal failures
        if failures:
            failures -= 1
            raise OperationalError("UPDATE", {}, ConnectionRefusedError("database is down"))
        return await release(*args, **kwargs)

    monkeypatch.setattr(pipeline.ledger, "release", flaky)
    pipeline.facilitator.script_settle(NotBroadcast())
    payment = await pipeline.pay("echo", BODY)
    out = await pipeline.call("echo", BODY, payment)
    assert isinstance(out, Refused) and (out.status, out.code) == (503, "ledger_unavailable")
    await pipeline.bookkeeping_done()  # the background release, once the ledger answers
    assert (await pipeline.row())["state"] == "released"
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)


async def test_states_are_the_documented_ones() -> None:
    assert {s.value for s in PaymentState} == {
        "claimed", "settling", "pending", "settled", "released", "failed"}


_ = echo  # (the harness's echo skill is registered by default)
