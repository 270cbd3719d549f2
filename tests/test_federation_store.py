"""Federation's ledger tables (federation/store.py) on a SQLite file and on PostgreSQL, through
two replicas (two Ledger objects on one database): sources and imported resources with their
version; outgoing intents within the caps (per call, per seller and day, per day), refused with
nothing written, never passed by concurrent writers; a reservation given back once, by the
transition to void; expired intents taken once among owners; a paid answer adopted by one caller
row; the per-seller totals, exact."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from federation.model import (
    Accept,
    Filters,
    ImportedResource,
    Margin,
    Offer,
    Source,
    network_info,
    resource_id_for,
    source_id_for,
)
from federation.store import (
    ALL_SELLERS,
    REFRESH_TURN,
    CapReached,
    Caps,
    FederationStore,
    Intent,
    IntentMoved,
    IntentState,
    NewIntent,
    StoredAnswer,
    utc_day,
)
from payments.ledger import Claimed, ClaimRequest, Ledger, PaymentKey
from payments.ledger_schema import outgoing_payments_table

NETWORK = "eip155:84532"
USDC = network_info(NETWORK).usdc  # type: ignore[union-attr]
PAY_TO = "0x" + "ab" * 20
SELLER_A = "https://a.example"
SELLER_B = "https://b.example:8443"
LEASE = 60.0
ROOMY = Caps(Decimal(1), Decimal(100), Decimal(1000))
TEN_PERCENT = Margin(Decimal(10))


@pytest.fixture
async def replicas(ledger_url: str) -> AsyncIterator[list[FederationStore]]:
    """Two replicas' stores: two Ledger objects (engines, connections) on one database."""
    engines = [create_async_engine(ledger_url) for _ in range(2)]
    ledgers = [Ledger(engine) for engine in engines]
    await ledgers[0].create_tables()
    yield [FederationStore(ledger) for ledger in ledgers]
    for ledger, engine in zip(ledgers, engines, strict=True):
        ledger.close()
        await engine.dispose()


def offer(path: str, atomic: int, *, seller: str = SELLER_A, name: str = "thing") -> Offer:
    return Offer(url=f"{seller}{path}", method="POST", seller=seller, name=name,
                 description=f"{name} from {seller}", categories=("Data",),
                 accepts=(Accept("exact", NETWORK, USDC, atomic, PAY_TO),))


def imported(source_id: str, o: Offer, margin: Margin = TEN_PERCENT) -> ImportedResource:
    return ImportedResource(resource_id_for(o.method, o.url), source_id, o,
                            margin.price(o.upstream_usd))


def new_intent(amount_usd: str, *, seller: str = SELLER_A, caller_row: str | None = None,
               payer: str = "0xpayer", digest: str = "d" * 64,
               resource: str = "x402.a-example.thing") -> NewIntent:
    usd = Decimal(amount_usd)
    return NewIntent(caller_row_id=caller_row or str(uuid.uuid4()), caller_payer=payer,
                     request_digest=digest, resource_id=resource, seller=seller,
                     url=f"{seller}/thing", network=NETWORK, asset=USDC, pay_to=PAY_TO,
                     amount_atomic=int(usd.scaleb(6)), amount_usd=usd)


async def opened(store: FederationStore, new: NewIntent, caps: Caps = ROOMY, *,
                 owner: str = "a", lease: float = LEASE) -> Intent:
    intent = await store.open_intent(new, caps, owner=owner, lease_seconds=lease)
    assert isinstance(intent, Intent), intent
    return intent


async def caller_row(store: FederationStore, *, amount: int, outcome: str,
                     charged: int | None = None, payer: str = "0xpayer",
                     digest: str = "d" * 64) -> str:
    """A caller's payment row in paywire_payments: settled (charged `charged`, else all), or
    released (its call delivered nothing, nobody was charged)."""
    ledger = store.ledger
    claimed = await ledger.claim(ClaimRequest(
        PaymentKey(NETWORK, payer, uuid.uuid4().hex), amount, USDC, "0xmerchant",
        "x402.a-example.thing", digest), owner="pipeline", lease_seconds=LEASE)
    assert isinstance(claimed, Claimed)
    if outcome == "released":
        assert await ledger.release(claimed.row_id, "the call failed")
    else:
        assert await ledger.begin_settlement(claimed.row_id, owner="pipeline", chain_ref={},
                                             lease_seconds=LEASE, charged_atomic=charged)
        assert await ledger.mark_settled(claimed.row_id, "0x" + "77" * 32, charged_atomic=charged)
    return claimed.row_id


async def intent_count(store: FederationStore) -> int:
    async with store.ledger.reading() as conn:
        return int((await conn.execute(select(func.count()).select_from(outgoing_payments_table)))
                   .scalar_one())


async def assert_reservations_match(store: FederationStore, day: str) -> None:
    """Each counter equals what its day's intents that are not void amount to."""
    intents = [i for i in await store.intents(limit=1000) if i.day == day]
    live = [i for i in intents if i.state != IntentState.VOID]
    for seller in {i.seller for i in intents}:
        assert await store.spent(day, seller) == sum(
            (i.amount_usd for i in live if i.seller == seller), Decimal(0)), seller
    assert await store.spent(day) == sum((i.amount_usd for i in live), Decimal(0))


# ---- sources and resources ------------------------------------------------------------------

async def test_sources_round_trip_and_are_replaced_by_id(replicas: list[FederationStore]) -> None:
    one, two = replicas
    catalogue_url = "https://facilitator.example/discovery/resources"
    catalogue = Source(source_id_for(catalogue_url), catalogue_url, "catalogue",
                       Filters(frozenset({"data"}), ("weather",), frozenset({NETWORK}),
                               Decimal("0.05"), frozenset({"a.example"}), frozenset({SELLER_B})),
                       Margin(Decimal("12.5"), Decimal("0.000001")), origin="env")
    seller = Source(source_id_for(SELLER_A + "/thing"), SELLER_A + "/thing", "seller")
    await one.put_source(catalogue)
    await one.put_source(seller)
    assert await two.sources() == [catalogue, seller]

    cheaper = replace(catalogue, margin=Margin(Decimal(0), Decimal("0.25")), origin="cli")
    await two.put_source(cheaper)
    assert await one.sources() == [cheaper, seller]  # replaced in place, order kept

    await one.note_refresh(seller.id, ok=False, detail="x" * 5000, count=0)
    await one.note_refresh(catalogue.id, ok=True, detail="2 items skipped", count=3)
    statuses = {s.source.id: s for s in await two.source_statuses()}
    assert statuses[catalogue.id].last_refresh_ok is True
    assert statuses[catalogue.id].last_count == 3
    assert statuses[catalogue.id].last_refresh_detail == "2 items skipped"
    assert statuses[seller.id].last_refresh_ok is False
    assert len(statuses[seller.id].last_refresh_detail or "") == 2000  # bounded
    assert statuses[seller.id].last_refresh_at is not None
    assert statuses[seller.id].last_refresh_at.tzinfo is not None

    assert await one.remove_source(seller.id) is True
    assert await one.remove_source(seller.id) is False
    assert await two.sources() == [cheaper]


async def test_replace_resources_reports_changes_and_moves_the_version_only_on_change(
        replicas: list[FederationStore]) -> None:
    one, two = replicas
    src, other = "src-1", "src-2"
    await one.put_source(Source(src, "https://one.example/catalogue", "catalogue"))
    await one.put_source(Source(other, "https://two.example/catalogue", "catalogue"))
    a, b, c = (imported(src, offer(p, 10_000)) for p in ("/a", "/b", "/c"))
    assert await two.version() == 0

    first = await one.replace_resources(src, [a, b])
    assert (first.added, first.changed, first.removed, first.clashes) == (
        tuple(sorted((a.resource_id, b.resource_id))), (), (), ())
    assert await two.version() == 1

    same = await two.replace_resources(src, [b, a, a])  # same content, any order, repeated
    assert not same.moved and await one.version() == 1

    dearer = imported(src, offer("/b", 20_000))
    assert dearer.resource_id == b.resource_id and dearer.price_usd == Decimal("0.022")
    second = await one.replace_resources(src, [dearer, c])
    assert (second.added, second.changed, second.removed) == (
        (c.resource_id,), (b.resource_id,), (a.resource_id,))
    assert await two.version() == 2
    assert {r.resource_id: r for r in await two.resources()} == {
        dearer.resource_id: dearer, c.resource_id: c}

    # another source offering an id src holds: not taken over, reported, nothing moves
    clash = imported(other, offer("/c", 5_000))
    own = imported(other, offer("/own", 5_000, seller=SELLER_B))
    third = await two.replace_resources(other, [clash, own])
    assert third.clashes == (c.resource_id,) and third.added == (own.resource_id,)
    assert await one.version() == 3
    held = {r.resource_id: r.source_id for r in await one.resources()}
    assert held[c.resource_id] == src and held[own.resource_id] == other

    with pytest.raises(ValueError, match="not src-1's"):
        await one.replace_resources(src, [own])

    # removing a source drops its resources (only its own), and the version moves
    assert await two.remove_source(src) is True
    assert [r.resource_id for r in await one.resources()] == [own.resource_id]
    assert await one.version() == 4
    assert not (await one.replace_resources(src, [])).moved and await one.version() == 4


# ---- intents and caps -----------------------------------------------------------------------

async def test_an_intent_is_written_with_a_fixed_payment_identifier_and_moves_forward(
        replicas: list[FederationStore]) -> None:
    one, two = replicas
    new = new_intent("0.01")
    intent = await opened(one, new, owner="replica-1")
    assert re.fullmatch(r"fed_[0-9a-f]{32}", intent.payment_identifier)
    assert (intent.state, intent.caller_row_id, intent.amount_atomic, intent.amount_usd) == (
        IntentState.INTENT, new.caller_row_id, 10_000, Decimal("0.01"))
    assert str(intent.amount_usd) == "0.01"  # as exact as given (no NUMERIC padding)
    assert intent.day == utc_day(datetime.now(UTC)) and intent.owner == "replica-1"
    assert intent.lease_until is not None and intent.lease_until > datetime.now(UTC)
    assert await two.call_intent(new.caller_row_id) == intent

    valid_before = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=3)
    ref = {"kind": "eip3009", "from": "0xop", "to": PAY_TO, "value": "10000", "nonce": "0x01"}
    await two.mark_signed(intent.id, payload='{"x402Version":2,"payload":"SIGNED"}',
                          chain_ref=ref, valid_before=valid_before)
    with pytest.raises(IntentMoved):  # signed once: a second signature is never stored
        await one.mark_signed(intent.id, payload="{}", chain_ref=ref, valid_before=valid_before)
    await one.mark_sent(intent.id)
    await one.mark_sent(intent.id)  # a resend
    await one.note_error(intent.id, "the seller answered 503")
    sent = await two.call_intent(new.caller_row_id)
    assert sent is not None and sent.state == IntentState.SENT
    assert (sent.payment_identifier, sent.chain_ref, sent.valid_before, sent.error) == (
        intent.payment_identifier, ref, valid_before, "the seller answered 503")
    assert "SIGNED" not in repr(sent)  # a signed payment is never printed

    answer = StoredAnswer(200, "application/json", b'{"ok":true}')
    await two.mark_paid(intent.id, tx_hash="0x" + "aa" * 32, answer=answer)
    paid = await one.call_intent(new.caller_row_id)
    assert paid is not None and (paid.state, paid.answer, paid.tx_hash) == (
        IntentState.PAID, answer, "0x" + "aa" * 32)
    assert await one.mark_void(intent.id, "late") is False  # paid stays paid
    assert await one.mark_lost(intent.id, "late", tx_hash=None) is False
    with pytest.raises(IntentMoved):
        await one.mark_sent(intent.id)

    # a later intent of the same caller row is the one call_intent gives
    later = await opened(two, replace(new, amount_usd=Decimal("0.02"), amount_atomic=20_000))
    assert later.payment_identifier != intent.payment_identifier
    assert (await one.call_intent(new.caller_row_id)).id == later.id  # type: ignore[union-attr]
    assert await one.call_intent("no-such-row") is None


async def test_a_voided_intent_is_never_signed_or_sent(replicas: list[FederationStore]) -> None:
    one, two = replicas
    intent = await opened(one, new_intent("0.01"))
    assert await two.mark_void(intent.id, "never signed")
    with pytest.raises(IntentMoved):
        await one.mark_signed(intent.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    signed = await opened(one, new_intent("0.01"))
    await one.mark_signed(signed.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    assert await two.mark_void(signed.id, "cannot move: expired")
    with pytest.raises(IntentMoved):
        await one.mark_sent(signed.id)
    # a lost one may be sent again (its seller may still hand over the answer), and stays lost
    lost = await opened(one, new_intent("0.01"))
    await one.mark_signed(lost.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    assert await two.mark_lost(lost.id, "moved, no answer", tx_hash="0x" + "bb" * 32)
    await one.mark_sent(lost.id)
    assert (await one.get(lost.id)).state == IntentState.LOST  # type: ignore[union-attr]


@pytest.mark.parametrize("which", ["per_call", "per_seller_day", "per_day"])
async def test_a_cap_refuses_with_nothing_written(replicas: list[FederationStore],
                                                  which: str) -> None:
    one, two = replicas
    caps = Caps(Decimal("0.05"), Decimal("0.10"), Decimal("0.15"))
    day = utc_day(datetime.now(UTC))
    if which == "per_call":
        reached = await one.open_intent(new_intent("0.050001"), caps, owner="a", lease_seconds=LEASE)
        assert reached == CapReached("per_call", Decimal("0.05"), Decimal("0.050001"))
        assert await intent_count(two) == 0 and await two.spent(day) == 0
        await opened(one, new_intent("0.05"), caps)  # at the cap is within it
        return
    await opened(one, new_intent("0.05", seller=SELLER_A), caps)
    await opened(two, new_intent("0.04", seller=SELLER_A), caps)
    if which == "per_seller_day":
        # 0.09 + 0.02 passes A's 0.10; all sellers stay below 0.15
        reached = await one.open_intent(new_intent("0.02", seller=SELLER_A), caps, owner="a",
                                        lease_seconds=LEASE)
        assert reached == CapReached("per_seller_day", Decimal("0.10"), Decimal("0.09"))
    else:
        await opened(two, new_intent("0.05", seller=SELLER_B), caps)
        # B alone would stay within 0.10, but all sellers would pass 0.15
        reached = await one.open_intent(new_intent("0.02", seller=SELLER_B), caps, owner="a",
                                        lease_seconds=LEASE)
        assert reached == CapReached("per_day", Decimal("0.15"), Decimal("0.14"))
        assert await two.spent(day, SELLER_B) == Decimal("0.05")  # B's raise rolled back too
    assert await intent_count(two) == (2 if which == "per_seller_day" else 3)
    assert await two.spent(day, SELLER_A) == Decimal("0.09")
    await assert_reservations_match(two, day)
    # what is left is still taken, exactly up to the cap
    left = Decimal("0.01")
    await opened(one, new_intent(str(left), seller=SELLER_A if which == "per_seller_day"
                                 else SELLER_B), caps)
    assert await two.spent(day) == (Decimal("0.10") if which == "per_seller_day"
                                    else Decimal("0.15"))


@pytest.mark.parametrize("which", ["per_seller_day", "per_day"])
async def test_concurrent_intents_never_pass_a_cap(replicas: list[FederationStore],
                                                   which: str) -> None:
    """36 intents of 0.01 race (18 tasks per replica) for a cap of 7 of them: exactly 7 are
    written, and the counters say 0.07."""
    one, two = replicas
    cap = Decimal("0.07")
    caps = (Caps(Decimal(1), cap, Decimal(100)) if which == "per_seller_day"
            else Caps(Decimal(1), Decimal(100), cap))
    sellers = [SELLER_A] if which == "per_seller_day" else [SELLER_A, SELLER_B, "https://c.example"]
    news = [new_intent("0.01", seller=sellers[i % len(sellers)]) for i in range(36)]
    outcomes = await asyncio.gather(*(
        (one, two)[i % 2].open_intent(new, caps, owner=f"replica-{i % 2}", lease_seconds=LEASE)
        for i, new in enumerate(news)))
    taken = [o for o in outcomes if isinstance(o, Intent)]
    refused = [o for o in outcomes if isinstance(o, CapReached)]
    assert len(taken) == 7 and len(refused) == 29
    assert {r.which for r in refused} == {which} and {r.cap_usd for r in refused} == {cap}
    assert all(r.spent_usd <= cap for r in refused)
    day = utc_day(datetime.now(UTC))
    assert await one.spent(day) == cap
    assert await intent_count(two) == 7
    await assert_reservations_match(one, day)


async def test_void_gives_the_reservation_back_once(replicas: list[FederationStore]) -> None:
    one, two = replicas
    caps = Caps(Decimal(1), Decimal("0.03"), Decimal(10))
    day = utc_day(datetime.now(UTC))
    first = await opened(one, new_intent("0.02"), caps)
    second = await opened(one, new_intent("0.01"), caps)
    assert isinstance(await one.open_intent(new_intent("0.01"), caps, owner="a",
                                            lease_seconds=LEASE), CapReached)
    # two replicas void the same intent at once: one transition, one give-back
    voided = await asyncio.gather(two.mark_void(first.id, "never signed"),
                                  one.mark_void(first.id, "never signed"))
    assert sorted(voided) == [False, True]
    assert await one.mark_void(first.id, "again") is False
    assert await two.spent(day, SELLER_A) == Decimal("0.01") and await two.spent(day) == Decimal("0.01")
    assert (await one.get(first.id)).error == "never signed"  # type: ignore[union-attr]
    # lost and paid keep theirs (the money moved)
    await one.mark_signed(second.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    assert await two.mark_lost(second.id, "moved, no answer", tx_hash=None)
    assert await one.mark_void(second.id, "late") is False
    third = await opened(two, new_intent("0.02"), caps)  # 0.01 + 0.02: the cap again
    await two.mark_paid(third.id, tx_hash=None, answer=StoredAnswer(200, "text/plain", b"ok"))
    assert await one.spent(day, SELLER_A) == Decimal("0.03")
    # a void one that the seller turns out to have been paid for counts again
    fourth = await opened(one, new_intent("0.005"), Caps(Decimal(1), Decimal(1), Decimal(10)))
    assert await one.mark_void(fourth.id, "looked unpaid")
    assert await one.spent(day, SELLER_A) == Decimal("0.03")
    await one.mark_paid(fourth.id, tx_hash="0x" + "cc" * 32, answer=None)
    assert await one.spent(day, SELLER_A) == Decimal("0.035")
    await assert_reservations_match(two, day)


async def test_expired_intents_are_taken_once_across_owners(replicas: list[FederationStore]) -> None:
    one, two = replicas
    expired = [await opened(one, new_intent("0.001"), lease=-1) for _ in range(12)]
    live = await opened(one, new_intent("0.001"), lease=LEASE)
    done = await opened(one, new_intent("0.001"), lease=-1)
    await one.mark_paid(done.id, tx_hash=None, answer=StoredAnswer(200, "text/plain", b"ok"))
    void = await opened(one, new_intent("0.001"), lease=-1)
    await one.mark_void(void.id, "never signed")

    takes = await asyncio.gather(*(
        (one, two)[i % 2].take_expired(owner=f"reconciler-{i}", lease_seconds=LEASE, limit=5)
        for i in range(6)))
    taken = [(i.id, owner) for owner, found in enumerate(takes) for i in found]
    assert sorted(i for i, _ in taken) == sorted(i.id for i in expired)  # each once, none else
    by_id = {i: owner for i, owner in taken}
    for found in takes:
        assert [i.created_at for i in found] == sorted(i.created_at for i in found)
    assert live.id not in by_id
    stored = await two.get(expired[0].id)
    assert stored is not None and stored.owner == f"reconciler-{by_id[expired[0].id]}"
    assert await one.take_expired(owner="late", lease_seconds=LEASE) == []  # leases live now

    # handed back by its owner (only): the next pass takes it
    await two.hand_back(expired[0].id, owner="someone-else")
    assert await one.take_expired(owner="late", lease_seconds=LEASE) == []
    await two.hand_back(expired[0].id, owner=f"reconciler-{by_id[expired[0].id]}")
    [again] = await one.take_expired(owner="late", lease_seconds=LEASE)
    assert again.id == expired[0].id and again.owner == "late"


async def test_a_paid_answer_nobody_was_charged_for_is_adopted_once(
        replicas: list[FederationStore]) -> None:
    one, two = replicas
    resource = "x402.a-example.thing"
    released = await caller_row(one, amount=11_000, outcome="released")
    intent = await opened(one, new_intent("0.01", caller_row=released, resource=resource))
    answer = StoredAnswer(200, "application/json", b'{"n":1}')
    assert await two.adoptable("0xpayer", "d" * 64, resource) is None  # not paid yet
    await one.mark_paid(intent.id, tx_hash=None, answer=answer)

    found = await two.adoptable("0xpayer", "d" * 64, resource)
    assert found is not None and found.id == intent.id and found.answer == answer
    assert await two.adoptable("0xother", "d" * 64, resource) is None
    assert await two.adoptable("0xpayer", "e" * 64, resource) is None
    assert await two.adoptable("0xpayer", "d" * 64, "x402.other") is None

    # two new caller rows of the same request race for it: one adopts
    rows = [str(uuid.uuid4()), str(uuid.uuid4())]
    won = await asyncio.gather(one.adopt(intent.id, from_row=released, to_row=rows[0]),
                               two.adopt(intent.id, from_row=released, to_row=rows[1]))
    assert sorted(won) == [False, True]
    winner = rows[won.index(True)]
    assert (await one.call_intent(winner)).id == intent.id  # type: ignore[union-attr]
    assert await one.call_intent(released) is None
    assert await one.adopt(intent.id, from_row=released, to_row="third") is False

    # a paid intent whose caller was charged is nobody else's
    settled = await caller_row(one, amount=11_000, outcome="settled")
    charged = await opened(one, new_intent("0.01", caller_row=settled, resource=resource))
    await one.mark_paid(charged.id, tx_hash=None, answer=answer)
    assert await two.adoptable("0xpayer", "d" * 64, resource) is None
    assert await two.adopt(charged.id, from_row=settled, to_row="thief") is False


async def test_seller_totals_are_exact(replicas: list[FederationStore]) -> None:
    one, two = replicas
    answer = StoredAnswer(200, "application/json", b"{}")

    async def paid(amount: str, seller: str, row: str) -> None:
        intent = await opened(one, new_intent(amount, seller=seller, caller_row=row))
        await one.mark_paid(intent.id, tx_hash=None, answer=answer)

    # seller A: three calls paid 0.010001 each, charged 0.011002 (one charged less: 0.0105 of
    # 0.012 authorized); one paid call whose caller was not charged; one lost; one void
    for charged in (None, None, 10_500):
        amount = 11_002 if charged is None else 12_000
        await paid("0.010001", SELLER_A,
                   await caller_row(one, amount=amount, outcome="settled", charged=charged))
    await paid("0.010001", SELLER_A, await caller_row(one, amount=11_002, outcome="released"))
    lost = await opened(one, new_intent("0.02", seller=SELLER_A))
    await one.mark_signed(lost.id, payload="{}", chain_ref={}, valid_before=datetime.now(UTC))
    assert await one.mark_lost(lost.id, "moved, no answer", tx_hash="0x" + "dd" * 32)
    void = await opened(one, new_intent("0.3", seller=SELLER_A))
    await one.mark_void(void.id, "never signed")
    # seller B: one call paid 0.25, charged 0.3; an open one counts nowhere yet
    await paid("0.25", SELLER_B, await caller_row(one, amount=300_000, outcome="settled"))
    await opened(one, new_intent("0.1", seller=SELLER_B))

    a, b = await two.seller_totals()
    assert a.seller == SELLER_A and b.seller == SELLER_B
    assert (a.paid_out_usd, a.calls, a.lost_usd, a.lost_calls) == (
        Decimal("0.040004"), 4, Decimal("0.02"), 1)
    # earned: (0.011002 + 0.011002 + 0.0105) charged - 3 x 0.010001 paid for them
    assert a.earned_usd == Decimal("0.032504") - Decimal("0.030003") == Decimal("0.002501")
    assert (b.paid_out_usd, b.calls, b.lost_usd, b.lost_calls, b.earned_usd) == (
        Decimal("0.25"), 1, Decimal(0), 0, Decimal("0.05"))


async def test_a_refresh_request_ends_the_refresh_turn(replicas: list[FederationStore]) -> None:
    one, two = replicas
    assert await one.request_refresh() is False  # nobody took it yet: free anyway
    assert await one.ledger.take_turn(REFRESH_TURN, owner="replica-1", seconds=3600)
    assert not await two.ledger.take_turn(REFRESH_TURN, owner="replica-2", seconds=3600)
    assert await one.request_refresh() is True
    assert await two.ledger.take_turn(REFRESH_TURN, owner="replica-2", seconds=3600)


def test_the_refresh_turn_is_the_one_the_runtime_takes() -> None:
    from federation import runtime

    assert runtime.TURN == REFRESH_TURN
    assert ALL_SELLERS == "*"
