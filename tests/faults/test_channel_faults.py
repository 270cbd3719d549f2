"""The fault suite on x402 `batch-settlement` channels (issue 23): a payer deposits once, then pays
each call with a voucher paywire checks locally and charges in its ledger; the charges reach the
chain later, claimed by one replica's claimer and swept to the merchant. The faults:

1. `kill -9` while a voucher call runs (accepted, not recorded): the payer resends the same
   request with the same voucher through the restart and is charged once.
2. `kill -9` during a claim, after its intent (nothing broadcast) and after its broadcast (the
   chain has it, the ledger does not): after the restart the claim resolves exactly once.
3. PostgreSQL stopped under two replicas while vouchers flow: told to retry, never refused,
   nothing charged twice, no result without a charge.
4. Two replicas taking vouchers of one channel at once: the same voucher sent to both (one
   charge), and two requests on one base (one wins, the other gets a 402).
5. `kill -9` during a payer's partial refund, once its hold began (nothing sent: the payer's
   retry goes through once the hold lapsed, once) and after its broadcast (the chain has it, the
   ledger does not: the claimer reopens the channel); vouchers go on after each.
6. The payer's withdrawal racing the claims: vouchers refused once it is seen, everything charged
   claimed before its delay ends; the payer gets back exactly the rest.

Every scenario ends with the channels' invariant (`check_channels`), read once every charge is
claimed and swept: Σ channels(id).totalClaimed on chain == Σ charged_atomic of the settled rows
== what the merchant received; per channel the rows' (base, charge) tile [0, running total) with
no gap and no overlap (no voucher counted twice); every 200 the client saw has its settled row
with delivered_at, and no settled row lacks a 200.

The vouchers are signed before any call, by the SDK (`sign_voucher`) on exact ceilings: the route
has a fixed price, so a channel's k-th call is charged on base k x price. The SDK's own client
signs the deposit (call 0)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from sqlalchemy import and_, select, update
from x402 import x402ClientSync
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS, SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.batch_settlement.errors import ERR_CHANNEL_BUSY
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig, RefundPayload, VoucherPayload
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.schemas import PaymentPayload

from payments.channels.store import CHANNEL_CLOSING
from payments.codec import decode_base64_any
from payments.ledger_schema import OPEN_CLAIMS, channels_table, claim_rows_table, claims_table
from tests.support.paying import EVM_NET, header, quote
from tests.support.postgres import PostgresServer

from .harness import (
    LEASE_SECONDS,
    RESOURCE,
    SETTLE_WITHIN,
    UNFINISHED,
    Chains,
    Client,
    ClientRun,
    Deployment,
    Payment,
    Unfinished,
    Violation,
    cut_by_the_kill,
    logged_problems,
    note,
    side_by_side,
)

# Claims at once (every charge passes $0.001) and swept after each: a scenario's charges are on
# chain and at the merchant's within a pass or two of its last call.
CLAIMING_ENV = {
    "PAYWIRE_NETWORKS": "base-sepolia",
    "PAYWIRE_CHANNEL_CLAIM_THRESHOLD_USD": "0.001",
    "PAYWIRE_CHANNEL_CLAIM_INTERVAL_SECONDS": "1",
    "PAYWIRE_CHANNEL_POLL_SECONDS": "0.5",
    "PAYWIRE_CHANNEL_SETTLE_INTERVAL_SECONDS": "1",
}
# The clients' deadline while a crash lasts (a restart on a loaded machine), as test_crashes.py;
# once it is over (ClientRun.answer_within) what is bounded is the gateway's recovery.
DURING_CRASH_SECONDS = 180
RECOVERY_SECONDS = 20 + LEASE_SECONDS
# From the last call to the last sweep: a claimer pass (0.5 s), a claim and a sweep on anvil.
CLAIMED_WITHIN = 30.0
# anvil's clock is the session's: a withdrawal's wait (the channel's delay, an hour) is a jump of
# the chain's time, set back right after. No EIP-3009 deposit, whose validBefore is the wall
# clock's + 300 s, may land meanwhile: the deposits of scenarios run beside it hold this too.
CHAIN_CLOCK = threading.Lock()
_K = claims_table.c
_R = claim_rows_table.c
_C = channels_table.c


# ------------------------------------------------------------------------------- deployments


def channel_env(chains: Chains) -> dict[str, str]:
    """A production gateway's settings with channels on: a receiver-authorizer key of its own
    (generated here) and fast claims."""
    authorizer = "0x" + bytes(Account.create().key).hex()
    return chains.deployment_env() | CLAIMING_ENV | {"PAYWIRE_CHANNEL_AUTHORIZER_KEY": authorizer}


@pytest.fixture(scope="module")
def channel_single(chains: Chains, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One gateway on a SQLite file, channels on; started by each test (with its failpoints)."""
    deployment = Deployment("ch-sqlite", chains, tmp_path_factory.mktemp("ch-sqlite"), replicas=1,
                            env=channel_env(chains))
    yield deployment
    deployment.close()


@pytest.fixture(scope="module")
def channel_replicas(chains: Chains, postgres_server: PostgresServer,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two replicas on one PostgreSQL database (a schema of their own), channels on, running."""
    deployment = Deployment("ch-pg", chains, tmp_path_factory.mktemp("ch-pg"), replicas=2,
                            db_url=postgres_server.fresh_url(), env=channel_env(chains))
    deployment.start()
    yield deployment
    deployment.close()


# ---------------------------------------------------------------------------------- channels


@dataclass
class OpenChannel:
    """A fresh payer's channel to a deployment and its calls, all signed before any is sent: the
    deposit (call 0, on base 0), then one voucher per base."""

    channel_id: str
    payer: str
    price: int
    calls: list[Payment]
    deposit: int
    account: LocalAccount
    config: ChannelConfig
    opening: PaymentPayload  # the deposit's payload: its `accepted` is the channel's requirement

    def refund(self, charged: int, amount: int) -> str:
        """The payment header of a partial refund, its voucher signed on the running total."""
        payload = RefundPayload()
        payload.channel_config = self.config
        payload.voucher = sign_voucher(EthAccountSigner(self.account), self.channel_id, charged, EVM_NET)
        payload.amount = str(amount)
        return header(self.opening.model_copy(update={"payload": payload.to_dict()}))


def open_channel(deployment: Deployment, tag: str, count: int) -> OpenChannel:
    """`count` calls of a fresh payer (funded with the channel's minimum deposit) on one channel,
    each a request of its own (a distinct text) to the fixed-price route."""
    url = deployment.gateways[0].url
    _, required = quote(f"{url}{RESOURCE}", {"text": "quote", "model": "gpt-4o"})
    [offer] = [o for o in required.accepts
               if o.scheme == SCHEME_BATCH_SETTLEMENT and o.network == EVM_NET]
    price, deposit = int(offer.amount), int(offer.extra["minDeposit"])
    assert count * price <= deposit, "the calls must fit one deposit"
    account = Account.from_key(deployment.chains.evm.new_payer(deposit))
    scheme = BatchSettlementEvmScheme(EthAccountSignerWithRPC(account, deployment.chains.evm.url))
    client = x402ClientSync().register(EVM_NET, scheme)
    client.set_spend_controls(False)
    opening = client.create_payment_payload(required.model_copy(update={"accepts": [offer]}))
    assert isinstance(opening, PaymentPayload) and opening.payload["type"] == "deposit"
    config = scheme.build_channel_config(offer)
    channel_id = compute_channel_id(config, EVM_NET).lower()
    signer = EthAccountSigner(account)
    payloads = [opening] + [voucher(opening, config, signer, channel_id, ceiling=(k + 1) * price)
                            for k in range(1, count)]
    payer = account.address.lower()
    calls = [Payment(k, EVM_NET, {"text": f"{tag}: call {k}, {os.urandom(4).hex()}",
                                  "model": "gpt-4o"},
                     header(payload), payer, f"{channel_id}/{k * price}", price)
             for k, payload in enumerate(payloads)]
    return OpenChannel(channel_id, payer, price, calls, deposit, account, config, opening)


def voucher(opening: PaymentPayload, config: ChannelConfig, signer: EthAccountSigner,
            channel_id: str, *, ceiling: int) -> PaymentPayload:
    """A voucher payload for the channel the deposit opens, signed for `ceiling`."""
    payload = VoucherPayload()
    payload.channel_config = config
    payload.voucher = sign_voucher(signer, channel_id, ceiling, EVM_NET)
    return opening.model_copy(update={"payload": payload.to_dict()})


def contract(deployment: Deployment) -> Any:
    return deployment.chains.evm.node.web3().eth.contract(address=BATCH_SETTLEMENT_ADDRESS,
                                                          abi=BATCH_SETTLEMENT_ABI)


def onchain(deployment: Deployment, channel_id: str) -> tuple[int, int]:
    """(balance, totalClaimed) of a channel, read from the contract."""
    balance, claimed = contract(deployment).functions.channels(bytes.fromhex(channel_id[2:])).call()
    return int(balance), int(claimed)


def refund_nonce(deployment: Deployment, channel_id: str) -> int:
    return int(contract(deployment).functions.refundNonce(bytes.fromhex(channel_id[2:])).call())


def wallet(deployment: Deployment, address: str) -> int:
    return deployment.chains.evm.usdc.balance_of(address)


def payer_tx(deployment: Deployment, account: LocalAccount, function: str, *args: Any) -> bool:
    """A transaction of the payer's own to the channel contract (it pays its gas): did it succeed?"""
    deployment.chains.evm.usdc.fund_gas(account.address, 10**17)
    w3 = deployment.chains.evm.node.web3()
    tx = getattr(contract(deployment).functions, function)(*args).build_transaction({
        "from": account.address, "gas": 300_000,
        "nonce": w3.eth.get_transaction_count(account.address, "pending")})
    sent = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    return bool(w3.eth.wait_for_transaction_receipt(sent, timeout=30)["status"] == 1)


def channel_row(deployment: Deployment, channel_id: str) -> dict[str, Any]:
    [row] = deployment.select(select(_C.state, _C.owner, _C.lease_until, _C.pending_row)
                              .where(_C.channel_id == channel_id))
    return row


def claim_events(deployment: Deployment, channel_id: str) -> list[tuple[str, int]]:
    """Each `Claimed` event of the channel on chain, oldest first: (transaction, totalClaimed)."""
    topic = "0x" + deployment.chains.evm.node.web3().keccak(
        text="Claimed(bytes32,address,uint128,uint128)").hex().removeprefix("0x")
    logs = deployment.chains.evm.node.rpc("eth_getLogs", [{
        "address": BATCH_SETTLEMENT_ADDRESS, "fromBlock": "0x0", "toBlock": "latest",
        "topics": [topic, channel_id]}])
    return [(str(e["transactionHash"]), int(str(e["data"])[2 + 64:2 + 128], 16)) for e in logs]


def merchant(deployment: Deployment) -> int:
    return deployment.chains.evm.usdc.balance_of(deployment.merchants[EVM_NET])


def claims_of(deployment: Deployment, channel_id: str) -> list[dict[str, Any]]:
    """The claims (kind claim) of a channel in the ledger, oldest first, with its claim_to."""
    return deployment.select(
        select(claims_table, _R.claim_to_atomic).join(claim_rows_table, _R.claim_id == _K.id)
        .where(_R.channel_id == channel_id).order_by(_K.created_at))


def lapse_claim_leases(deployment: Deployment, *, written_before: datetime) -> list[str]:
    """What waiting out a claim's lease does to the open claims and sweeps last written before
    `written_before` (a dead process's, or a pass whose outcome could not be recorded: nobody works
    on them any more): the next claimer pass resolves them from the chain. The lease is
    ClaimPolicy.lease_seconds, 120 s, which no setting shortens: only the clock is shortened here.
    Returns what was lapsed (kind, state, amount)."""
    now = datetime.now(UTC)
    abandoned = and_(_K.state.in_(OPEN_CLAIMS), _K.lease_until > now, _K.updated_at < written_before)
    found = deployment.select(select(_K.id, _K.kind, _K.state, _K.amount_atomic).where(abandoned))
    deployment.write(update(claims_table).where(and_(abandoned, _K.id.in_([c["id"] for c in found])))
                     .values(lease_until=now - timedelta(seconds=1)))
    return [f"{c['kind']} {c['state']} {c['amount_atomic']}" for c in found]


# ---------------------------------------------------------------------------- the invariant


def check_channels(scenario: str, deployment: Deployment, opened: Sequence[OpenChannel],
                   merchant_before: int, *, started: float, quiet_since: float) -> Counter[str]:
    """The channels' invariant, once every charge is claimed and swept (waited for: the rows
    finished within a lease and a reconciler pass after the fault ended, the claims within
    CLAIMED_WITHIN). Prints the counts; raises Violation, then Unfinished."""
    ids = {c.channel_id for c in opened}

    def rows() -> list[dict[str, Any]]:
        return [r for r in deployment.rows()
                if r["scheme"] == SCHEME_BATCH_SETTLEMENT and r["channel_id"] in ids]

    def ledger_totals() -> dict[str, int]:
        return {r["channel_id"]: int(r["charged_atomic"]) for r in deployment.select(
            select(_C.channel_id, _C.charged_atomic).where(_C.channel_id.in_(ids)))}

    def settled() -> bool:
        if any(r["state"] in UNFINISHED for r in rows()):
            return False
        totals = ledger_totals()
        claimed = {cid: onchain(deployment, cid)[1] for cid in ids}
        return claimed == totals and merchant(deployment) - merchant_before == sum(totals.values())

    in_time = until(settled, quiet_since + SETTLE_WITHIN + CLAIMED_WITHIN)
    found = rows()
    totals = ledger_totals()
    problems: list[str] = []
    unfinished = [f"row {r['id']} ({r['nonce']}) still {r['state']}" for r in found
                  if r["state"] in UNFINISHED]
    charged = Counter[str]()
    for channel in opened:
        cid = channel.channel_id
        tiles = sorted((int(r["nonce"].rsplit("/", 1)[1]), int(r["charged_atomic"]))
                       for r in found if r["channel_id"] == cid and r["state"] == "settled")
        reach = 0
        for base, charge in tiles:  # no gap, no overlap: no voucher counted twice
            if base != reach or charge != channel.price:  # (a fixed price: each call its price)
                problems.append(f"channel {cid}: charge {charge} on base {base}, the tiles reach "
                                f"{reach} (price {channel.price})")
            reach = max(reach, base + charge)
        charged[cid] = sum(c for _, c in tiles)
        _, total_claimed = onchain(deployment, cid)
        if not charged[cid] == totals.get(cid) == total_claimed:
            problems.append(f"channel {cid}: settled rows {charged[cid]}, the ledger's running total "
                            f"{totals.get(cid)}, totalClaimed on chain {total_claimed}")
    moved = merchant(deployment) - merchant_before
    if moved != sum(charged.values()):
        problems.append(f"the merchant received {moved}; the settled rows charged {sum(charged.values())}")
    by_key: dict[tuple[str, str, str], list[Payment]] = {}
    for payment in (p for c in opened for p in c.calls):
        by_key.setdefault(payment.key, []).append(payment)
    row_of = {(r["network"], r["payer"], r["nonce"]): r for r in found}
    counts = Counter[str]()
    for key, payments in by_key.items():
        row = row_of.get(key, {})
        state = row.get("state")
        results = {body for p in payments for body in p.results}
        where = f"call {key[2]} (row {row.get('id')}, {state})"
        counts["calls"] += len(payments)
        counts["delivered"] += bool(results)
        counts["charged"] += state == "settled"
        counts["released"] += state == "released"
        if len(results) > 1:
            problems.append(f"{where}: {len(results)} distinct results to one voucher")
        if results and (state != "settled" or row.get("delivered_at") is None):
            problems.append(f"{where}: a result was delivered without a delivered, settled row")
        if state == "settled" and not results:
            problems.append(f"{where}: charged {row['charged_atomic']} but no client got its result")
        for p in payments:
            if p.results and p.final is not None and p.final.status != 200:
                problems.append(f"{where}: delivered, then the same request sent again was "
                                f"answered {p.final.status} {p.final.code}")
    answers = Counter(f"{a.status} {a.code}" if a.code else str(a.status)
                      for c in opened for p in c.calls for a in p.answers)
    claims = Counter(str(c["state"]) for cid in ids for c in claims_of(deployment, cid))
    note(f"[faults] {scenario}: calls={counts['calls']} delivered={counts['delivered']} "
         f"charged={counts['charged']} released={counts['released']} atomic={sum(charged.values())} "
         f"on-chain claimed={sum(onchain(deployment, cid)[1] for cid in ids)} merchant+={moved} "
         f"claims {dict(sorted(claims.items()))} ({time.monotonic() - started:.1f} s, settled "
         f"{'in time' if in_time else 'late'}; answers: "
         f"{', '.join(f'{k} {v}' for k, v in sorted(answers.items()))})")
    if problems or unfinished or not in_time:  # what the channels and the claimers say, to diagnose
        for cid in ids:
            [state] = deployment.select(select(_C.state, _C.claim_due_at, _C.total_claimed_atomic)
                                        .where(_C.channel_id == cid)) or [{}]
            note(f"  channel {cid}: {dict(state)}; claims "
                 f"{[(c['state'], c['claim_to_atomic']) for c in claims_of(deployment, cid)]}")
        for line in logged_problems(deployment, words=(
                "quarantined", "claim pass failed", "could not", "WARNING", "ERROR"))[-30:]:
            note(f"  {line}")
    if problems:
        raise Violation(f"{scenario}: {len(problems)} problems:\n" + "\n".join(problems[:40]))
    if unfinished or not in_time:
        raise Unfinished(f"{scenario}: not claimed and swept within {CLAIMED_WITHIN:.0f} s of the "
                         f"rows' lease: {unfinished or 'the chain is behind the ledger'}")
    return counts


def until(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll `condition` until it holds (True) or time.monotonic() passes `deadline` (False)."""
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling the ledger and the chain with a deadline
    return True


def wait_all(runs: Sequence[ClientRun]) -> None:
    for run in runs:
        run.wait()


def delivered(opened: Sequence[OpenChannel]) -> int:
    return sum(bool(p.results) for c in opened for p in c.calls)


def told(opened: Sequence[OpenChannel], code: str) -> int:
    return sum(p.told(code) for c in opened for p in c.calls)


# ---------------------------------------------------------------------------------- 1. kill -9


KILLED = 3  # during_run's third hit: the deposit's call, voucher 1, then voucher 2 dies
CALLS = 5


def kill_while_a_voucher_runs(deployment: Deployment) -> None:
    gateway = deployment.gateways[0]
    gateway.restart(failpoints=f"during_run=kill@{KILLED}")
    opened = open_channel(deployment, "kill during a voucher's run", CALLS)
    before, started = merchant(deployment), time.monotonic()
    client = Client(deployment.urls, deadline_seconds=DURING_CRASH_SECONDS)
    paying = client.start(opened.calls, concurrency=1)
    gateway.wait_killed(paying)
    lapsed = lapse_claim_leases(deployment, written_before=datetime.now(UTC))  # (its open claims)
    gateway.start()  # the supervisor brings it back, without the failpoint
    quiet = time.monotonic()
    paying.answer_within(RECOVERY_SECONDS)
    paying.wait()
    client.replay(opened.calls)
    cut = cut_by_the_kill(opened.calls)
    assert cut.index == KILLED - 1 and cut.results, "the voucher cut by the kill is delivered"
    counts = check_channels(f"sqlite, 1 process, kill -9 during a voucher call's run (claims it "
                            f"left open: {lapsed or 'none'})", deployment, [opened], before,
                            started=started, quiet_since=quiet)
    assert counts["delivered"] == counts["charged"] == CALLS


# ------------------------------------------------------------------------- 2. kill -9 in a claim


def kill_during_a_claim(deployment: Deployment, point: str) -> None:
    """The first claim dies at `point`; the channel's vouchers go on through the restart."""
    gateway = deployment.gateways[0]
    gateway.restart(failpoints=f"{point}=kill@1")
    opened = open_channel(deployment, f"kill -9 {point}", 3)
    before, started = merchant(deployment), time.monotonic()
    client = Client(deployment.urls, deadline_seconds=DURING_CRASH_SECONDS)
    paying = client.start(opened.calls, concurrency=1)
    gateway.wait_killed(paying)
    [left] = [c for c in claims_of(deployment, opened.channel_id) if c["state"] in OPEN_CLAIMS]
    assert lapse_claim_leases(deployment, written_before=datetime.now(UTC))
    gateway.start()
    quiet = time.monotonic()
    paying.answer_within(RECOVERY_SECONDS)
    paying.wait()
    client.replay(opened.calls)
    counts = check_channels(f"sqlite, 1 process, kill -9 {point}", deployment, [opened], before,
                            started=started, quiet_since=quiet)
    assert counts["delivered"] == counts["charged"] == len(opened.calls)
    # The claim the kill left open resolved exactly once, from the chain, and no claim was sent
    # twice: each Claimed event raised totalClaimed (a resend would repeat a total).
    claims = {c["id"]: c for c in claims_of(deployment, opened.channel_id)}
    resolved = claims[left["id"]]
    events = claim_events(deployment, opened.channel_id)
    totals = [total for _, total in events]
    assert totals == sorted(set(totals)) and totals[-1] == counts["charged"] * opened.price, events
    assert sum(c["state"] == "settled" for c in claims.values()) == len(events), (claims, events)
    if point == "claim_after_intent":  # nothing was broadcast: released, claimed again later
        assert resolved["state"] == "released" and resolved["tx_hash"] is None, resolved
    else:  # the chain has it: settled with the transaction its Claimed event names, once
        assert resolved["state"] == "settled", resolved
        assert (resolved["tx_hash"], left["claim_to_atomic"]) in events, (resolved, events)
        assert [total for _, total in events].count(left["claim_to_atomic"]) == 1


# -------------------------------------------------------------------- 3. PostgreSQL stopped


CHANNELS, VOUCHERS = 4, 29  # calls enough that vouchers still flow when the database goes


def postgres_stopped_while_vouchers_flow(deployment: Deployment, postgres: PostgresServer) -> None:
    """Channels paying vouchers on both replicas, one call at a time each: the database goes once
    a few were delivered, while the rest are in flight."""
    opened = [open_channel(deployment, f"postgres stopped, channel {i}", VOUCHERS + 1)
              for i in range(CHANNELS)]
    before, started = merchant(deployment), time.monotonic()
    # the deposits first, through the facilitator: a channel to pay vouchers on
    with CHAIN_CLOCK:
        Client(deployment.urls).start([c.calls[0] for c in opened], concurrency=4).wait()
    runs = [Client(deployment.urls, deadline_seconds=60).start(c.calls[1:], concurrency=1, first=i % 2)
            for i, c in enumerate(opened)]
    try:
        assert until(lambda: delivered(opened) >= len(opened) + 4, time.monotonic() + 30)
        postgres.halt()
        assert until(lambda: told(opened, "ledger_unavailable") >= 3, time.monotonic() + 30)
    finally:
        if not (postgres.data_dir / "postmaster.pid").exists():
            postgres.resume()
    quiet = time.monotonic()
    wait_all(runs)
    # (a claim whose outcome could not be written while the database was down is decided from
    # the chain by its claimer's next pass: no lease is waited out here)
    for answer in (a for c in opened for p in c.calls for a in p.answers):
        assert answer.status in (None, 200, 409, 503), f"refused during the outage: {answer}"
        if answer.status in (409, 503):
            assert answer.retry_after, f"no Retry-After: {answer}"
    Client(deployment.urls).replay([p for c in opened for p in c.calls])
    counts = check_channels("postgres, 2 replicas, the database stopped mid-traffic", deployment,
                            opened, before, started=started, quiet_since=quiet)
    assert counts["delivered"] == counts["charged"] == sum(len(c.calls) for c in opened)


# ---------------------------------------------------------------- 4. two replicas, one channel

ROUNDS = 3  # of each race


def race(deployment: Deployment, pair: Sequence[Payment]) -> None:
    """Each payment to its own replica, their first sends at the same moment, each retried there
    until its final answer."""
    together = threading.Barrier(len(pair))
    runs = [Client([url], deadline_seconds=30).start([p], concurrency=1, together=together)
            for url, p in zip(deployment.urls, pair, strict=True)]
    wait_all(runs)


def two_replicas_on_one_channel(deployment: Deployment) -> None:
    opened = open_channel(deployment, "two replicas, one channel", 1 + 2 * ROUNDS)
    before, started = merchant(deployment), time.monotonic()
    deposit, same, different = (opened.calls[:1], opened.calls[1:1 + ROUNDS],
                                opened.calls[1 + ROUNDS:])
    with CHAIN_CLOCK:
        Client(deployment.urls).start(deposit, concurrency=1, first=0).wait()
    twins: list[Payment] = []
    for call in same:  # the same voucher and request to both replicas: one charge, one result
        twin = replace(call, answers=[], results=[], transactions=[], final=None)
        race(deployment, [call, twin])
        twins.append(twin)
        assert call.results and twin.results and call.results[0] == twin.results[0]
    rivals: list[Payment] = []
    for call in different:  # two requests on one base: one wins, the other is refused (402)
        rival = replace(call, body={**call.body, "text": call.body["text"] + " (the rival)"},
                        answers=[], results=[], transactions=[], final=None)
        race(deployment, [call, rival])
        rivals.append(rival)
        finals = sorted((p.final.status, p.final.code) for p in (call, rival) if p.final)
        assert [status for status, _ in finals] == [200, 402], finals
    opened.calls += twins + rivals
    quiet = time.monotonic()
    client = Client(deployment.urls)
    client.replay(opened.calls)
    collided = sum(any(a.status != 200 for a in c.answers + t.answers)
                   for c, t in zip(same, twins, strict=True))
    refused = Counter(str(p.final.code) for p in different + rivals if p.final and p.final.status == 402)
    counts = check_channels(f"postgres, 2 replicas taking one channel's vouchers at once (same "
                            f"voucher: {collided}/{ROUNDS} overlapped; one base: refused "
                            f"{dict(refused)})", deployment, [opened], before, started=started,
                            quiet_since=quiet)
    assert counts["charged"] == 1 + 2 * ROUNDS  # a charge per base, whoever won it


# ------------------------------------------------------------------------ 5. kill -9 in a refund


def pay(deployment: Deployment, calls: list[Payment]) -> None:
    """Each call once, one at a time, each delivered."""
    Client(deployment.urls).start(calls, concurrency=1).wait()
    assert [p.final and p.final.status for p in calls] == [200] * len(calls), [p.final for p in calls]


def ask_refund(deployment: Deployment, payment: str) -> httpx.Response:
    """A refund request as the SDK's client sends one, POSTed with no body to a paid route."""
    return httpx.post(f"{deployment.urls[0]}{RESOURCE}", headers={"PAYMENT-SIGNATURE": payment},
                      timeout=60)


def refund_killed(deployment: Deployment, payment: str) -> None:
    """A refund request the gateway dies answering (its failpoint): no answer."""
    gateway = deployment.gateways[0]
    with pytest.raises(httpx.TransportError):
        ask_refund(deployment, payment)
    assert gateway.proc is not None and gateway.proc.wait(timeout=30) == -signal.SIGKILL
    lapse_claim_leases(deployment, written_before=datetime.now(UTC))  # (a claim it left open)


def kill_during_a_refund(deployment: Deployment) -> None:
    """Seven calls on one channel and two partial refunds between them: the first killed once
    its hold began, the second after its broadcast."""
    gateway = deployment.gateways[0]
    gateway.restart(failpoints="channel_refund_after_begin=kill@1")
    opened = open_channel(deployment, "kill -9 during a refund", 7)
    cid, price = opened.channel_id, opened.price
    first, second = opened.deposit // 5, opened.deposit // 8
    before, started = merchant(deployment), time.monotonic()
    pay(deployment, opened.calls[:3])

    # killed once the hold began: nothing moved on chain, the channel held (closing)
    refund = opened.refund(3 * price, first)
    refund_killed(deployment, refund)
    assert (onchain(deployment, cid)[0], refund_nonce(deployment, cid)) == (opened.deposit, 0)
    held = channel_row(deployment, cid)
    assert (held["state"], held["pending_row"]) == ("closing", None) and held["owner"], held
    # (the second refund to reach its broadcast kills this one: the retry's goes through)
    gateway.start(failpoints="channel_refund_after_broadcast=kill@2")
    busy = ask_refund(deployment, refund)  # the hold runs: told when it lapses
    assert busy.status_code == 402 and busy.json()["reason"] == ERR_CHANNEL_BUSY, busy.text
    assert 1 <= float(busy.headers["Retry-After"]) <= 120, busy.headers
    deployment.write(update(channels_table).where(_C.channel_id == cid)  # waiting out its lease
                     .values(lease_until=datetime.now(UTC) - timedelta(seconds=1)))
    retried = ask_refund(deployment, refund)
    assert retried.status_code == 200, retried.text
    receipt = json.loads(decode_base64_any(retried.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] and int(receipt["amount"]) == first, receipt
    assert (onchain(deployment, cid)[0], refund_nonce(deployment, cid)) == (opened.deposit - first, 1)
    assert channel_row(deployment, cid)["state"] == "open"
    pay(deployment, opened.calls[3:5])

    # killed after the broadcast: the chain has it; the restarted claimer ends the hold from it
    refund_killed(deployment, opened.refund(5 * price, second))
    assert (onchain(deployment, cid)[0], refund_nonce(deployment, cid)) == (
        opened.deposit - first - second, 2)
    # held (closing) until a claimer's mirror sees refundNonce moved: the dead process's own
    # claimer may have seen it while the refund's receipt was awaited, before the kill
    assert channel_row(deployment, cid)["state"] in ("closing", "open")
    gateway.start()
    quiet = time.monotonic()
    assert until(lambda: channel_row(deployment, cid)["state"] == "open", quiet + RECOVERY_SECONDS), \
        channel_row(deployment, cid)
    assert channel_row(deployment, cid)["owner"] is None
    pay(deployment, opened.calls[5:])
    counts = check_channels("sqlite, 1 process, kill -9 during a refund (after its hold began, "
                            "after its broadcast)", deployment, [opened], before, started=started,
                            quiet_since=quiet)
    assert counts["delivered"] == counts["charged"] == len(opened.calls)
    assert onchain(deployment, cid)[0] == opened.deposit - first - second
    assert wallet(deployment, opened.payer) == first + second  # its own, nothing more


# -------------------------------------------------------------- 6. a withdrawal racing the claims


def a_withdrawal_racing_the_claims(deployment: Deployment) -> None:
    """Three calls, then the payer starts withdrawing all it deposited."""
    opened = open_channel(deployment, "a withdrawal racing the claims", 4)
    cid, charged = opened.channel_id, 3 * opened.price
    before, started = merchant(deployment), time.monotonic()
    pay(deployment, opened.calls[:3])
    config = to_contract_channel_config(opened.config)
    # all the chain holds unclaimed (the contract's most): a claim landing first makes it revert,
    # and the payer asks again (three charges: a few claims at most)
    for _ in range(4):
        balance, claimed = onchain(deployment, cid)
        if payer_tx(deployment, opened.account, "initiateWithdraw", config, balance - claimed):
            break
    else:
        raise AssertionError("initiateWithdraw reverted four times")
    assert until(lambda: channel_row(deployment, cid)["state"] == "closing",
                 time.monotonic() + CLAIMED_WITHIN), "the claimer did not see the withdrawal"
    late = opened.calls[3:]
    Client(deployment.urls).start(late, concurrency=1).wait()
    assert [(a.status, a.code) for a in late[0].answers] == [(402, CHANNEL_CLOSING)]
    # everything charged is claimed before the delay ends; then the payer takes the rest
    assert until(lambda: onchain(deployment, cid)[1] == charged, time.monotonic() + CLAIMED_WITHIN)
    node = deployment.chains.evm.node
    with CHAIN_CLOCK:
        node.rpc("evm_increaseTime", [opened.config.withdraw_delay])
        node.rpc("evm_mine", [])
        try:
            assert payer_tx(deployment, opened.account, "finalizeWithdraw", config)
        finally:  # (the chain's time back to the wall clock's, for the deposits signed after)
            node.rpc("evm_setTime", [int(time.time())])
            node.rpc("evm_mine", [])
    quiet = time.monotonic()
    assert wallet(deployment, opened.payer) == opened.deposit - charged
    counts = check_channels("sqlite, 1 process, a withdrawal racing the claims", deployment,
                            [opened], before, started=started, quiet_since=quiet)
    assert (counts["delivered"], counts["charged"]) == (3, 3)
    assert until(lambda: channel_row(deployment, cid)["state"] == "closed", quiet + CLAIMED_WITHIN)


# ------------------------------------------------------------------------------------- tests


def test_kill_9_during_a_voucher_call_or_a_refund_and_replicas_racing_on_one_channel(
        channel_single: Deployment, channel_replicas: Deployment) -> None:

    def voucher_then_refund() -> None:
        kill_while_a_voucher_runs(channel_single)
        kill_during_a_refund(channel_single)

    side_by_side(voucher_then_refund, lambda: two_replicas_on_one_channel(channel_replicas))


def test_kill_9_during_a_claim_a_withdrawal_racing_the_claims_and_postgres_stopped_mid_traffic(
        channel_single: Deployment, channel_replicas: Deployment,
        postgres_server: PostgresServer) -> None:
    channel_replicas.ensure_running()

    def both_claim_points() -> None:
        kill_during_a_claim(channel_single, "claim_after_intent")
        kill_during_a_claim(channel_single, "claim_after_broadcast")
        a_withdrawal_racing_the_claims(channel_single)

    side_by_side(both_claim_points,
                 lambda: postgres_stopped_while_vouchers_flow(channel_replicas, postgres_server))

