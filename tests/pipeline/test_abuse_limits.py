"""Limiting abuse in the pipeline: what is provably invalid is refused without the facilitator,
quotes and refused payments are rate limited per client address and per (proven) payer, and the
operator's controls (skill switches, the payer deny list, on the ledger's database) hold before
any quote or any facilitator round trip. Each test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from eth_account import Account
from x402.schemas import PaymentPayload

from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.requests import CallRequest, Payment
from payments import precheck
from payments.controls import Controls
from payments.rate_limits import LimitSpec, RateLimits
from tests.support.paying import client_for
from tests.support.scripted_facilitator import (
    INSUFFICIENT_BALANCE,
    RECIPIENT_MISMATCH,
    VALID_AFTER_FUTURE,
    VALID_BEFORE_EXPIRED,
    VALUE_MISMATCH,
    Invalid,
)

from .harness import PAYER, Pipeline, echo, make_skill, payment_of

BODY = {"text": "hello"}
BAD_SIGNATURE = "invalid_exact_evm_payload_signature"
FAILED_TO_VERIFY = "invalid_exact_evm_failed_to_verify_signature"
ERC6492_MAGIC = "6492" * 16  # the 32-byte suffix of an ERC-6492 wrapped signature
OTHER_KEY = "0x" + "7a" * 32  # a second throwaway payer
CLIENT_A, CLIENT_B, CLIENT_C = "198.51.100.7", "198.51.100.8", "2001:db8::1"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits(clock: Clock, *, quotes: tuple[int, int] = (0, 1), payments: tuple[int, int] = (0, 1)
           ) -> RateLimits:
    return RateLimits(
        LimitSpec(*quotes, "PAYWIRE_RATE_QUOTES_PER_MINUTE", "PAYWIRE_RATE_QUOTES_BURST"),
        LimitSpec(*payments, "PAYWIRE_RATE_PAYMENTS_PER_MINUTE", "PAYWIRE_RATE_PAYMENTS_BURST"),
        clock=clock)


def guard(pipeline: Pipeline, *, controls: Controls | None = None,
          rate_limits: RateLimits | None = None) -> None:
    """The pipeline's gateway again, with the operator's controls and the rate limits."""
    old = pipeline.gateway
    pipeline.gateway = Gateway(pipeline.registry, old.processor, pipeline.ledger, policy=old.policy,
                               reconciler=old.reconciler, controls=controls, limits=rate_limits)


async def call(pipeline: Pipeline, client: str | None, payment: Payment | None = None,
               skill_id: str = "echo", payload: dict[str, Any] | None = None) -> Outcome:
    return await pipeline.gateway.call(CallRequest(
        skill_id=skill_id, payload=BODY if payload is None else payload,
        resource_url=f"https://paywire.test/{skill_id}", payment=payment, client=client))


def tampered(signed: dict[str, Any], **fields: str) -> Payment:
    auth = signed["payload"]["authorization"]
    for name, value in fields.items():
        auth[name] = value
    return payment_of(signed)


async def signed_by(pipeline: Pipeline, key: str) -> dict[str, Any]:
    """A payment for the gateway's quote for BODY, signed by `key`."""
    quote = await pipeline.call("echo", BODY)
    assert isinstance(quote, PaymentDemanded)
    payload = client_for("http://unused.invalid", evm_key=key).create_payment_payload(quote.required)
    assert isinstance(payload, PaymentPayload)
    return payload.model_dump(by_alias=True, exclude_none=True)


def throttled(out: Outcome, who: str, setting: str) -> Refused:
    assert isinstance(out, Refused) and (out.status, out.code) == (429, "rate_limited"), out
    assert out.retry_after is not None and out.retry_after >= 1
    assert f"from this {who}" in out.message and setting in out.message, out.message
    return out


# ---- refused locally: what every facilitator refuses, without asking one --------------------

NOW = int(time.time())
LOCAL_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], Payment], str, str]] = [
    ("wrong amount", lambda s: tampered(s, value="1"), VALUE_MISMATCH, "authorization.value"),
    ("wrong recipient", lambda s: tampered(s, to=Account.create().address), RECIPIENT_MISMATCH,
     "authorization.to"),
    ("expired", lambda s: tampered(s, validBefore=str(NOW - 60)), VALID_BEFORE_EXPIRED,
     "validBefore"),
    ("inside the SDK's 6 s margin", lambda s: tampered(s, validBefore=str(NOW + 3)),
     VALID_BEFORE_EXPIRED, "validBefore"),
    ("not valid yet", lambda s: tampered(s, validAfter=str(NOW + 600)), VALID_AFTER_FUTURE,
     "validAfter"),
    ("broken ERC-6492 wrapper", lambda s: payment_of({**s, "payload": {
        **s["payload"], "signature": "0x" + "00" * 40 + ERC6492_MAGIC}}), FAILED_TO_VERIFY,
     "ERC-6492"),
]


@pytest.mark.parametrize(("case", "mutate", "reason", "named"), LOCAL_REFUSALS,
                         ids=[c[0] for c in LOCAL_REFUSALS])
async def test_provably_invalid_payments_are_refused_without_the_facilitator(
    pipeline: Pipeline, case: str, mutate: Callable[[dict[str, Any]], Payment], reason: str,
    named: str,
) -> None:
    out = await pipeline.call("echo", BODY, mutate(await pipeline.signed("echo", BODY)))
    assert isinstance(out, PaymentDemanded) and out.reason == reason, out
    assert out.message is not None and named in out.message
    assert pipeline.facilitator.calls == []  # no verify, no settle
    assert await pipeline.rows() == []


async def test_an_eoa_length_signature_by_another_key_is_left_to_the_facilitator(
    pipeline: Pipeline,
) -> None:
    """It may be a smart wallet's (EIP-1271) or an EIP-7702 account's: only the chain can say."""
    other = await signed_by(pipeline, OTHER_KEY)
    forged = await pipeline.signed("echo", BODY)
    forged["payload"]["signature"] = other["payload"]["signature"]
    pipeline.facilitator.script_verify(Invalid(BAD_SIGNATURE))
    out = await pipeline.call("echo", BODY, payment_of(forged))
    assert isinstance(out, PaymentDemanded) and out.reason == BAD_SIGNATURE
    assert pipeline.facilitator.verify_calls == 1


async def test_a_settled_payment_retried_after_it_expired_still_gets_its_kept_result(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    payment = await pipeline.pay("echo", BODY)
    first = await pipeline.call("echo", BODY, payment)
    assert isinstance(first, Delivered) and first.receipt is not None
    monkeypatch.setattr(precheck, "wall_clock", lambda: time.time() + 3600)  # validBefore passed
    again = await pipeline.call("echo", BODY, payment)
    assert isinstance(again, Delivered), again
    assert again.result.body == {"echo": BODY}
    assert again.receipt is not None and again.receipt.transaction == first.receipt.transaction
    assert pipeline.facilitator.verify_calls == 1 and pipeline.facilitator.settle_calls == 1
    [row] = await pipeline.rows()
    assert row["state"] == "settled"


# ---- rate limits -------------------------------------------------------------------------------

async def test_quotes_beyond_the_limit_get_429_per_client_address(pipeline: Pipeline) -> None:
    clock = Clock()
    guard(pipeline, rate_limits=limits(clock, quotes=(60, 2)))
    for _ in range(2):
        assert isinstance(await call(pipeline, CLIENT_A), PaymentDemanded)
    out = throttled(await call(pipeline, CLIENT_A), "client address", "PAYWIRE_RATE_QUOTES_PER_MINUTE")
    assert out.retry_after == 1  # one quote a second
    # before any work on the request: a throttled client's bad input is not even validated
    throttled(await call(pipeline, CLIENT_A, payload={"text": 5}), "client address",
              "PAYWIRE_RATE_QUOTES_BURST")
    assert isinstance(await call(pipeline, CLIENT_B), PaymentDemanded)  # another client
    assert isinstance(await call(pipeline, None), PaymentDemanded)  # in process: no address
    clock.now += 1
    assert isinstance(await call(pipeline, CLIENT_A), PaymentDemanded)
    throttled(await call(pipeline, CLIENT_A), "client address", "PAYWIRE_RATE_QUOTES_PER_MINUTE")


async def test_a_paid_call_gives_its_quote_back_so_paying_clients_are_never_throttled(
    pipeline: Pipeline,
) -> None:
    guard(pipeline, rate_limits=limits(Clock(), quotes=(60, 2), payments=(60, 2)))
    for n in range(6):  # quote, pay, quote, pay...: far beyond both bursts, never limited
        quote = await call(pipeline, CLIENT_A, payload={"text": f"call {n}"})
        assert isinstance(quote, PaymentDemanded), quote
        signed = client_for("http://unused.invalid", evm_key="0x" + "5e" * 32
                            ).create_payment_payload(quote.required)
        out = await call(pipeline, CLIENT_A, payment_of(signed.model_dump(by_alias=True,
                                                                          exclude_none=True)),
                         payload={"text": f"call {n}"})
        assert isinstance(out, Delivered), out
    assert pipeline.facilitator.settle_calls == 6


async def test_refused_payments_beyond_the_limit_get_429_before_the_facilitator(
    pipeline: Pipeline,
) -> None:
    clock = Clock()
    guard(pipeline, rate_limits=limits(clock, payments=(60, 2)))
    # refused locally, then by the facilitator: both count
    out = await call(pipeline, CLIENT_A, tampered(await pipeline.signed("echo", BODY), value="1"))
    assert isinstance(out, PaymentDemanded) and out.reason == VALUE_MISMATCH
    pipeline.facilitator.script_verify(Invalid(INSUFFICIENT_BALANCE))
    out = await call(pipeline, CLIENT_A, await pipeline.pay("echo", BODY))
    assert isinstance(out, PaymentDemanded) and out.reason == INSUFFICIENT_BALANCE
    assert pipeline.facilitator.verify_calls == 1
    # out of budget: even a good payment from this address waits, and the facilitator is not asked
    good = await pipeline.pay("echo", BODY)
    out = throttled(await call(pipeline, CLIENT_A, good), "client address",
                    "PAYWIRE_RATE_PAYMENTS_PER_MINUTE")
    assert out.retry_after == 1
    # an undecodable payment from that address is refused the same way, before it is decoded
    throttled(await call(pipeline, CLIENT_A, Payment(None, "not base64", "PAYMENT-SIGNATURE")),
              "client address", "PAYWIRE_RATE_PAYMENTS_BURST")
    assert pipeline.facilitator.verify_calls == 1 and await pipeline.rows() == []
    assert isinstance(await call(pipeline, CLIENT_C, good), Delivered)  # another client
    clock.now += 1
    assert isinstance(await call(pipeline, CLIENT_A, await pipeline.pay("echo", BODY)), Delivered)


async def test_a_payer_whose_signed_payments_keep_failing_is_limited_from_any_address(
    pipeline: Pipeline,
) -> None:
    guard(pipeline, rate_limits=limits(Clock(), payments=(60, 2)))
    pipeline.facilitator.script_verify(Invalid(INSUFFICIENT_BALANCE), Invalid(INSUFFICIENT_BALANCE))
    for client in (CLIENT_A, CLIENT_B):  # two addresses, one budget each: neither runs out
        out = await call(pipeline, client, await pipeline.pay("echo", BODY))
        assert isinstance(out, PaymentDemanded) and out.reason == INSUFFICIENT_BALANCE
    # the payer's own budget is spent (its key signed both): a third address does not help
    throttled(await call(pipeline, CLIENT_C, await pipeline.pay("echo", BODY)), "payer",
              "PAYWIRE_RATE_PAYMENTS_PER_MINUTE")
    assert pipeline.facilitator.verify_calls == 2
    # another payer from that address is not affected
    other = await signed_by(pipeline, OTHER_KEY)
    assert isinstance(await call(pipeline, CLIENT_C, payment_of(other)), Delivered)


async def test_forged_payments_naming_a_payer_do_not_spend_its_budget(pipeline: Pipeline) -> None:
    """`from` is only a claim until the signature proves it: forgeries from many addresses must
    not lock the real payer out."""
    guard(pipeline, rate_limits=limits(Clock(), payments=(60, 1)))
    for client in (CLIENT_A, CLIENT_B, CLIENT_C):
        forged = await signed_by(pipeline, OTHER_KEY)
        forged["payload"]["authorization"]["from"] = PAYER
        pipeline.facilitator.script_verify(Invalid(BAD_SIGNATURE))
        out = await call(pipeline, client, payment_of(forged))
        assert isinstance(out, PaymentDemanded) and out.reason == BAD_SIGNATURE
    out = await call(pipeline, "203.0.113.9", await pipeline.pay("echo", BODY))
    assert isinstance(out, Delivered), out
    assert out.receipt is not None and out.receipt.payer == PAYER


# ---- the operator's controls -------------------------------------------------------------------

async def test_a_switched_off_skill_answers_503_before_any_quote_and_is_marked(
    pipeline: Pipeline,
) -> None:
    controls = Controls(pipeline.ledger.engine)
    guard(pipeline, controls=controls)
    pipeline.add(make_skill("free-echo", echo, price="0"))
    payment = await pipeline.pay("echo", BODY)  # signed while it was on
    await controls.set_skill("echo", enabled=False, reason="upstream outage", changed_by="test")
    await controls.set_skill("free-echo", enabled=False, changed_by="test")
    for out in (await pipeline.call("echo", None),  # a probe
                await pipeline.call("echo", BODY),  # a quote
                await pipeline.call("echo", BODY, payment),  # a paid attempt
                await pipeline.call("echo", {"text": 5})):  # bad input: not even validated
        assert isinstance(out, Refused) and (out.status, out.code) == (503, "skill_disabled"), out
        assert "switched off by the operator: upstream outage" in out.message
        assert "nothing was charged" in out.message
    out = await pipeline.call("free-echo", BODY)
    assert isinstance(out, Refused) and out.code == "skill_disabled"
    assert pipeline.facilitator.calls == [] and await pipeline.rows() == []
    assert not pipeline.gateway.catalogue.available("echo")
    assert pipeline.gateway.catalogue.available("no-such-skill")  # unknown ids are not switched

    await controls.set_skill("echo", enabled=True, changed_by="test")
    assert pipeline.gateway.catalogue.available("echo")
    assert isinstance(await pipeline.call("echo", BODY, payment), Delivered)
    assert [s.skill_id for s in await controls.disabled_skills()] == ["free-echo"]


async def test_a_switch_made_by_another_replica_arrives_with_the_next_refresh(
    pipeline: Pipeline,
) -> None:
    mine, theirs = Controls(pipeline.ledger.engine), Controls(pipeline.ledger.engine)
    guard(pipeline, controls=mine)
    await mine.refresh()
    await theirs.set_skill("echo", enabled=False, changed_by="replica 2")
    assert isinstance(await pipeline.call("echo", BODY), PaymentDemanded)  # not read yet
    assert await mine.refresh() is True
    out = await pipeline.call("echo", BODY)
    assert isinstance(out, Refused) and out.code == "skill_disabled"
    assert await mine.refresh() is False  # nothing changed since: one tiny query, no reload


async def test_a_denied_payer_is_refused_before_verify_and_nothing_is_claimed(
    pipeline: Pipeline,
) -> None:
    controls = Controls(pipeline.ledger.engine)
    guard(pipeline, controls=controls)
    await controls.deny_payer(PAYER.upper().replace("0X", "0x"), reason="chargebacks")  # any case
    assert controls.denied(PAYER.lower()) is not None
    out = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    assert isinstance(out, Refused) and (out.status, out.code) == (403, "payer_denied"), out
    assert PAYER.lower() in out.message and "nothing was charged" in out.message
    assert pipeline.facilitator.calls == [] and await pipeline.rows() == []
    # quotes are still answered (a quote names no payer)
    assert isinstance(await pipeline.call("echo", BODY), PaymentDemanded)

    assert await controls.allow_payer(PAYER) is True
    out = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))
    assert isinstance(out, Delivered) and out.receipt is not None and out.receipt.success
    assert await controls.allow_payer(PAYER) is False


async def test_a_payer_charged_before_its_denial_still_gets_what_it_paid_for(
    pipeline: Pipeline,
) -> None:
    controls = Controls(pipeline.ledger.engine)
    guard(pipeline, controls=controls)
    payment = await pipeline.pay("echo", BODY)
    first = await pipeline.call("echo", BODY, payment)
    assert isinstance(first, Delivered) and first.receipt is not None
    await controls.deny_payer(PAYER, reason="abuse")
    again = await pipeline.call("echo", BODY, payment)  # the same payment: the kept result
    assert isinstance(again, Delivered), again
    assert again.result.body == {"echo": BODY}
    assert again.receipt is not None and again.receipt.transaction == first.receipt.transaction
    assert pipeline.facilitator.settle_calls == 1
    other = await pipeline.call("echo", {"text": "other"}, payment)  # used for another request
    assert isinstance(other, Refused) and other.code == "payer_denied", other
    fresh = await pipeline.call("echo", BODY, await pipeline.pay("echo", BODY))  # a new payment
    assert isinstance(fresh, Refused) and fresh.code == "payer_denied", fresh
    assert pipeline.facilitator.settle_calls == 1 and len(await pipeline.rows()) == 1
