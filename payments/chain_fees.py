"""Chain fees: what every on-chain transaction paywire's payments cause cost in gas or fees, read
from the chain after the fact (issue 23 §6: the operator sees real margins).

One row per transaction in `paywire_chain_fees` (primary key (network, tx_id): a fee is counted
once, whoever registers or reads it). Rows come from three places:

- the payment rows: a settled (or released) exact or upto payment with a transaction is a
  `settlement` / `upto_settlement`; an upto settlement of zero has no transaction, so no fee;
- the refunds: a confirmed Solana refund is a `refund` (sent, and paid for, by the pay-to wallet);
- whatever other code registers with `expect(ledger, tx_id, network, kind, ref)`: the channel
  code's deposits, claims, sweeps and cooperative refunds (payments/channels/), right after a
  node accepted the transaction (registering one never sent leaves a row the meter marks
  `missing` after `GIVE_UP_SECONDS`).

Nothing is written on the hot path. `ChainFeeMeter`, a background task on every replica (one at a
time: the ledger turn `chain_fees`, as refund batches take theirs), registers what the payment and
refund rows name and reads each waiting transaction's fee through the RPC the reconciler asks:
EVM `eth_getTransactionReceipt` (gasUsed x effectiveGasPrice, plus the `l1Fee` an OP-stack node
such as Base's reports; the Isthmus operator fee, zero on Base, is not added), Solana
`getTransaction` (meta.fee, paid by the message's first account). Who paid is the chain's answer
(the receipt's `from`, the fee payer), never assumed.

Derived by scanning, so a crash loses nothing: the payment and refund tables are walked by keyset
in bounded chunks (a `head` that follows new rows from a day back, and a `rescan` that walks the
whole table again and again, for rows settled long after they were created); a row already
registered is left as it is. A transaction the node does not know yet waits and is asked again
later (backing off up to an hour); one still unknown `GIVE_UP_SECONDS` after it was registered is
`missing`. Each pass reads at most `reads` receipts; a pass that had more to do is followed by
another while the turn lasts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Table, and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from .chain_probe import JsonRpc, ProbeError, UnexpectedAnswer
from .ledger import Ledger
from .ledger_schema import (
    ChainFeeState,
    PaymentState,
    RefundState,
    chain_fees_table,
    payments_table,
    refunds_table,
)

log = logging.getLogger("paywire.chain_fees")

TURN = "chain_fees"  # the ledger turn (paywire_turns) one replica's meter holds at a time
GIVE_UP_SECONDS = 2 * 86_400.0  # a transaction the node still does not know by then: missing
MAX_RETRY_SECONDS = 3_600.0
HEAD_LOOKBACK = timedelta(days=1)  # where a starting meter's head begins (the rescan covers the rest)
CHUNK = 500  # rows read per keyset step (SQLite reads run inline: each step holds the loop)
HEAD_ROWS_PER_PASS = 20_000
RESCAN_ROWS_PER_PASS = 2_500
READS_PER_PASS = 500
READS_IN_FLIGHT = 8
_COMMITMENT = "confirmed"
_HEX_TX = re.compile(r"0x[0-9a-fA-F]{64}")
_QUANTITY = re.compile(r"0x[0-9a-fA-F]{1,64}")


class FeeKind(enum.StrEnum):
    """What a transaction did for paywire's payments."""

    SETTLEMENT = "settlement"  # an exact payment's settlement (EIP-3009, Solana transfer)
    UPTO_SETTLEMENT = "upto_settlement"  # an upto payment's Permit2 settlement (never of zero)
    REFUND = "refund"  # a Solana refund, from the pay-to wallet
    DEPOSIT = "deposit"  # a batch-settlement channel's deposit
    CLAIM = "claim"  # channels' vouchers claimed (one transaction, many channels)
    SWEEP = "sweep"  # claimed funds settled to the receiver (`settle`)
    CHANNEL_REFUND = "channel_refund"  # a channel's cooperative refund


_METERED_SCHEMES = ("exact", "upto")  # channel calls' transactions are registered by their code


# -- the native tokens and their USD prices ----------------------------------------------------

@dataclass(frozen=True)
class NativeToken:
    """The token a network's fees are paid in, and its smallest unit."""

    symbol: str
    unit: str
    decimals: int
    setting: str  # the variable holding its USD price

    def whole(self, amount: int) -> Decimal:
        """`amount` smallest units as whole tokens (exact)."""
        return Decimal(amount).scaleb(-self.decimals)


ETH = NativeToken("ETH", "wei", 18, "PAYWIRE_ETH_USD")
SOL = NativeToken("SOL", "lamports", 9, "PAYWIRE_SOL_USD")
NATIVE_TOKENS = (ETH, SOL)


def native_token(network: str) -> NativeToken:
    """The fee token of a CAIP-2 network: ETH on EVM networks paywire serves (Base), SOL on
    Solana."""
    return SOL if network.startswith("solana:") else ETH


@dataclass(frozen=True)
class FeePrices:
    """The operator's USD prices of the native tokens (no oracle: nothing is fetched at run
    time). A token without a price has its fees shown in native units only."""

    usd: Mapping[str, Decimal] = field(default_factory=dict)

    @staticmethod
    def of(eth_usd: Decimal | None = None, sol_usd: Decimal | None = None) -> FeePrices:
        given = {ETH.symbol: eth_usd, SOL.symbol: sol_usd}
        return FeePrices({symbol: price for symbol, price in given.items() if price is not None})

    def usd_of(self, token: NativeToken, amount: int) -> Decimal | None:
        """The USD value of `amount` smallest units, exact; None without a price."""
        price = self.usd.get(token.symbol)
        return None if price is None else token.whole(amount) * price

    def as_dict(self) -> dict[str, str]:
        return {symbol: format(price, "f") for symbol, price in sorted(self.usd.items())}


def tx_key(network: str, tx_id: str) -> str:
    """A transaction's id as the table keys it: EVM hashes in lower case (a hash is hex, any
    case); Solana signatures as they are (base58 is case-sensitive)."""
    return tx_id if network.startswith("solana:") else tx_id.lower()


# -- what the chain says -----------------------------------------------------------------------

@dataclass(frozen=True)
class FeeReading:
    """One landed transaction's fee, as its chain reports it."""

    paid_by: str
    fee: int  # in the native token's smallest unit: all the payer paid for this transaction
    block_number: int
    succeeded: bool
    gas_used: int | None = None  # EVM
    gas_price: int | None = None  # EVM: the effective gas price (wei per gas)
    l1_fee: int | None = None  # OP-stack: the L1 data fee (wei)


async def read_fee(network: str, tx_id: str, rpc: JsonRpc) -> FeeReading | None:
    """The transaction's fee, or None when the node does not know it (yet). ProbeError when the
    node cannot be asked or answers something unusable."""
    if network.startswith("solana:"):
        return await _solana_fee(tx_id, rpc)
    return await _evm_fee(tx_id, rpc)


async def _evm_fee(tx_id: str, rpc: JsonRpc) -> FeeReading | None:
    receipt = await rpc.call("eth_getTransactionReceipt", [tx_id])
    if receipt is None:
        return None
    if (not isinstance(receipt, dict) or str(receipt.get("transactionHash", "")).lower() != tx_id
            or receipt.get("blockNumber") is None):
        raise UnexpectedAnswer("eth_getTransactionReceipt: not this transaction's mined receipt")
    gas_used = _quantity(receipt.get("gasUsed"), "gasUsed")
    gas_price = _quantity(receipt.get("effectiveGasPrice"), "effectiveGasPrice")
    l1_fee = (_quantity(receipt["l1Fee"], "l1Fee") if receipt.get("l1Fee") is not None else None)
    paid_by = receipt.get("from")
    if not isinstance(paid_by, str) or not paid_by:
        raise UnexpectedAnswer("eth_getTransactionReceipt: no `from`")
    return FeeReading(paid_by=paid_by.lower(), fee=gas_used * gas_price + (l1_fee or 0),
                      block_number=_quantity(receipt["blockNumber"], "blockNumber"),
                      succeeded=_quantity(receipt.get("status"), "status") == 1,
                      gas_used=gas_used, gas_price=gas_price, l1_fee=l1_fee)


async def _solana_fee(signature: str, rpc: JsonRpc) -> FeeReading | None:
    answer = await rpc.call("getTransaction", [signature, {
        "encoding": "base64", "maxSupportedTransactionVersion": 0, "commitment": _COMMITMENT}])
    if answer is None:
        return None
    answer = answer if isinstance(answer, dict) else {}
    meta, encoded, slot = answer.get("meta"), answer.get("transaction"), answer.get("slot")
    if (not isinstance(meta, dict) or not _whole(meta.get("fee")) or not _whole(slot)
            or not isinstance(encoded, list) or len(encoded) != 2 or encoded[1] != "base64"):
        raise UnexpectedAnswer("getTransaction: no base64 transaction with meta.fee and its slot")
    return FeeReading(paid_by=_fee_payer(encoded[0]), fee=meta["fee"], block_number=slot,
                      succeeded=meta.get("err") is None)


def _fee_payer(encoded: Any) -> str:
    """A Solana transaction's fee payer: its message's first account."""
    from solders.transaction import VersionedTransaction

    try:
        tx = VersionedTransaction.from_bytes(base64.b64decode(encoded, validate=True))
        return str(tx.message.account_keys[0])
    except (binascii.Error, ValueError, IndexError, TypeError) as exc:
        raise UnexpectedAnswer("getTransaction: the transaction does not decode") from exc


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _quantity(value: Any, name: str) -> int:
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise UnexpectedAnswer(f"eth_getTransactionReceipt: {name} is not a hex quantity")
    return int(value, 16)


def _well_formed(network: str, tx_id: str) -> bool:
    if network.startswith("solana:"):
        from solders.signature import Signature

        try:
            Signature.from_string(tx_id)
        except Exception:  # solders raises its own types for bad input
            return False
        return True
    return bool(_HEX_TX.fullmatch(tx_id))


# -- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Waiting:
    """A registered transaction whose fee is not read yet."""

    network: str
    tx_id: str
    attempts: int
    expected_at: datetime


def _payment_kind(row: Mapping[str, Any]) -> FeeKind | None:
    """A payment row's transaction: a settled (or released: a settlement that reverted still paid
    its gas) exact or upto payment's. Channel calls' transactions are registered by their code."""
    if (not row["tx_hash"] or row["state"] not in (PaymentState.SETTLED, PaymentState.RELEASED)
            or row["scheme"] not in _METERED_SCHEMES):
        return None
    permit2 = (row["chain_ref"] or {}).get("kind") == "permit2"  # upto rows may say exact
    return FeeKind.UPTO_SETTLEMENT if row["scheme"] == "upto" or permit2 else FeeKind.SETTLEMENT


def _refund_kind(row: Mapping[str, Any]) -> FeeKind | None:
    """A refund's transaction, once confirmed (the attempts that never landed paid nothing)."""
    return FeeKind.REFUND if row["state"] == RefundState.CONFIRMED else None


@dataclass(frozen=True)
class _Source:
    """A table whose rows name transactions paywire caused (walked by keyset on (created_at, id))."""

    table: Table
    tx: str  # the column holding the transaction's id
    columns: tuple[str, ...]  # what `kind` reads
    kind: Callable[[Mapping[str, Any]], FeeKind | None]

    def page(self, after: tuple[datetime, str] | None, limit: int) -> Any:
        t = self.table
        statement = (select(*(t.c[name] for name in self.columns))
                     .order_by(t.c.created_at, t.c.id).limit(limit))
        if after is not None:
            statement = statement.where(or_(t.c.created_at > after[0],
                                            and_(t.c.created_at == after[0], t.c.id > after[1])))
        return statement

    def registered(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """The fee row `row` calls for (no `state` yet), or None."""
        kind = self.kind(row)
        if kind is None:
            return None
        return {"network": row["network"], "tx_id": tx_key(row["network"], row[self.tx]),
                "kind": kind, "ref": row["id"], "skill": row.get("skill_id"),
                "at": row["created_at"]}


SOURCES = (
    _Source(payments_table, "tx_hash", ("id", "network", "tx_hash", "state", "scheme",
                                        "chain_ref", "skill_id", "created_at"), _payment_kind),
    _Source(refunds_table, "signature", ("id", "network", "signature", "state", "created_at"),
            _refund_kind),
)


def _now() -> datetime:
    return datetime.now(UTC)


class ChainFees:
    """The chain fee rows, over the ledger's database and its transactions."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._dialect = ledger.engine.dialect.name

    async def expect(self, tx_id: str, network: str, kind: FeeKind | str, ref: str | None = None,
                     *, at: datetime | None = None, conn: Any = None) -> bool:
        """Register a transaction paywire caused (the channel code's deposits, claims, sweeps and
        cooperative refunds), once a node accepted it: the meter reads its fee later. `ref` says
        what it is for (a channel id, a claim); `at` the day its fee counts on (default now).
        `conn`: a transaction of `Ledger.writing()` to register it in (with the caller's own
        record). True if it was new; registering one twice keeps the first."""
        row = _expected(tx_id, network, kind, ref, at)
        if conn is not None:
            return await self._insert(conn, [row]) == 1
        async with self._ledger.writing() as own:
            return await self._insert(own, [row]) == 1

    async def register(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Register `rows` (network, tx_id, kind, ref, at) not registered yet; how many were."""
        rows = [row for row in rows if _well_formed(row["network"], row["tx_id"])]
        if not rows:
            return 0
        f = chain_fees_table
        keys = {(row["network"], row["tx_id"]) for row in rows}
        async with self._ledger.reading() as conn:
            known = {(n, tx) for n, tx in (await conn.execute(select(f.c.network, f.c.tx_id).where(
                f.c.tx_id.in_({tx for _, tx in keys})))).all()}
        fresh = list({(r["network"], r["tx_id"]): r for r in rows
                      if (r["network"], r["tx_id"]) not in known}.values())
        if not fresh:
            return 0
        now = _now()
        async with self._ledger.writing() as conn:
            return await self._insert(conn, [{**r, "state": ChainFeeState.WAITING,
                                              "attempts": 0, "expected_at": now} for r in fresh])

    async def _insert(self, conn: Any, rows: list[dict[str, Any]]) -> int:
        """INSERT ... ON CONFLICT DO NOTHING (two meters, or a meter and `expect`, at once)."""
        dialect = postgresql if self._dialect == "postgresql" else sqlite
        statement = dialect.insert(chain_fees_table).on_conflict_do_nothing(
            index_elements=["network", "tx_id"]).returning(chain_fees_table.c.tx_id)
        return len((await conn.execute(statement, rows)).all())  # the rows inserted

    async def due(self, networks: Iterable[str], limit: int) -> list[Waiting]:
        """Waiting transactions of these networks whose next try has come, oldest first."""
        f, now = chain_fees_table, _now()
        statement = (select(f.c.network, f.c.tx_id, f.c.attempts, f.c.expected_at)
                     .where(and_(f.c.state == ChainFeeState.WAITING, f.c.network.in_(list(networks)),
                                 or_(f.c.next_try_at.is_(None), f.c.next_try_at <= now)))
                     .order_by(f.c.expected_at, f.c.tx_id).limit(limit))
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(statement)).all()
        return [Waiting(n, tx, int(attempts), _aware(expected)) for n, tx, attempts, expected in rows]

    async def record(self, network: str, tx_id: str, reading: FeeReading) -> bool:
        """The fee read (compare-and-set on `waiting`: written once). True if this call wrote it."""
        return await self._change(network, tx_id, state=ChainFeeState.RECORDED,
                                  paid_by=reading.paid_by, gas_used=reading.gas_used,
                                  gas_price=reading.gas_price, l1_fee=reading.l1_fee,
                                  fee=reading.fee, block_number=reading.block_number,
                                  succeeded=reading.succeeded, observed_at=_now(), error=None,
                                  next_try_at=None)

    async def postpone(self, item: Waiting, error: str, *, retry_seconds: float,
                       give_up: bool) -> bool:
        """No fee this time: asked again after a back-off, or `missing` (given up)."""
        attempts = item.attempts + 1
        delay = min(retry_seconds * 2 ** (attempts - 1), MAX_RETRY_SECONDS)
        state = ChainFeeState.MISSING if give_up else ChainFeeState.WAITING
        return await self._change(item.network, item.tx_id, state=state, attempts=attempts,
                                  error=error[:2000], next_try_at=_now() + timedelta(seconds=delay))

    async def _change(self, network: str, tx_id: str, **values: Any) -> bool:
        f = chain_fees_table
        async with self._ledger.writing() as conn:
            moved = await conn.execute(update(f).where(and_(
                f.c.network == network, f.c.tx_id == tx_id, f.c.state == ChainFeeState.WAITING))
                .values(**values))
            return moved.rowcount == 1

    async def rows(self, *, network: str | None = None) -> list[dict[str, Any]]:
        """Every fee row (of one network), by when it counts (for operators and tests)."""
        f = chain_fees_table
        statement = select(f).order_by(f.c.at, f.c.tx_id)
        if network is not None:
            statement = statement.where(f.c.network == network)
        async with self._ledger.reading() as conn:
            return [dict(row) for row in (await conn.execute(statement)).mappings().all()]


async def expect(ledger: Ledger, tx_id: str, network: str, kind: FeeKind | str,
                 ref: str | None = None, *, at: datetime | None = None, conn: Any = None) -> bool:
    """The channel code's hook (payments/channels/): `ChainFees(ledger).expect`."""
    return await ChainFees(ledger).expect(tx_id, network, kind, ref, at=at, conn=conn)


def _expected(tx_id: str, network: str, kind: FeeKind | str, ref: str | None,
              at: datetime | None) -> dict[str, Any]:
    """`expect`'s row, its fields checked (ValueError naming the field)."""
    try:
        kind = FeeKind(kind)
    except ValueError:
        raise ValueError(f"kind: one of {', '.join(k.value for k in FeeKind)}, got {kind!r}") from None
    if not isinstance(network, str) or ":" not in network or len(network) > 64:
        raise ValueError(f"network: a CAIP-2 id such as eip155:8453, got {network!r}")
    if not isinstance(tx_id, str) or not _well_formed(network, tx_id):
        raise ValueError(f"tx_id: a transaction id of {network} (EVM: 0x and 64 hex digits; "
                         f"Solana: a signature), got {str(tx_id)[:100]!r}")
    if ref is not None and (not isinstance(ref, str) or len(ref) > 66):
        raise ValueError("ref: at most 66 characters (a row id, a channel id)")
    now = _now()
    return {"network": network, "tx_id": tx_key(network, tx_id), "kind": kind, "ref": ref,
            "skill": None, "at": at or now, "state": ChainFeeState.WAITING, "attempts": 0, "expected_at": now}


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# -- the meter ---------------------------------------------------------------------------------

@dataclass
class MeterTally:
    turn: bool = False  # this pass held the turn
    registered: int = 0  # transactions newly found in the payment and refund rows
    recorded: int = 0  # fees read and written
    waiting: int = 0  # not known to the node yet, or it could not be asked: tried again later
    missing: int = 0  # given up
    full: bool = False  # the pass stopped at its budget: there is more to do


@dataclass
class _Sweep:
    """Where one source's scans are: `head` follows new rows, `rescan` walks the whole table
    again and again (rows settled long after they were created)."""

    head: tuple[datetime, str] | None
    rescan: tuple[datetime, str] | None = None


class ChainFeeMeter:
    """Registers the transactions the ledger names and reads their fees, one replica at a time."""

    def __init__(self, ledger: Ledger, rpcs: Mapping[str, JsonRpc], *, owner: str,
                 interval_seconds: float = 60.0, retry_seconds: float = 30.0,
                 reads: int = READS_PER_PASS, chunk: int = CHUNK,
                 give_up_seconds: float = GIVE_UP_SECONDS) -> None:
        self._ledger, self._fees, self._rpcs = ledger, ChainFees(ledger), dict(rpcs)
        self._owner, self._interval = f"chain-fees@{owner}", interval_seconds
        self._retry, self._reads, self._chunk = retry_seconds, reads, chunk
        self._give_up = give_up_seconds
        start = (_now() - HEAD_LOOKBACK, "")
        self._sweeps = {source.table.name: _Sweep(head=start) for source in SOURCES}

    async def run_once(self) -> MeterTally:
        """Take the turn, then pass after pass while the last one had more to do (within the
        turn's period)."""
        tally = MeterTally(turn=await self._ledger.take_turn(
            TURN, owner=self._owner, seconds=self._interval))
        if not tally.turn:
            return tally
        ends = time.monotonic() + self._interval * 0.8
        while True:
            await self.meter(tally)
            if not tally.full or time.monotonic() > ends:
                break
        if tally.registered or tally.recorded or tally.missing:
            log.info("chain fees: %d transactions registered, %d fees recorded, %d waiting, "
                     "%d given up", tally.registered, tally.recorded, tally.waiting, tally.missing)
        return tally

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - the database or a node may be down
                log.warning("chain fee pass failed (%s: %s); next pass in %.0f s",
                            type(exc).__name__, exc, self._interval)
            await asyncio.sleep(self._interval)

    async def meter(self, tally: MeterTally) -> None:
        """One pass without the turn (`run_once` takes it first): register, then read. Safe
        beside another replica's pass: a row is inserted once and its fee written once."""
        tally.full = False
        for source in SOURCES:
            found = await self._scan(source, tally)
            tally.registered += found
        due = await self._fees.due(self._rpcs, self._reads)
        tally.full = tally.full or len(due) >= self._reads
        gate = asyncio.Semaphore(READS_IN_FLIGHT)

        async def read(item: Waiting) -> None:
            async with gate:
                await self._read(item, tally)
        await asyncio.gather(*(read(item) for item in due))

    async def _scan(self, source: _Source, tally: MeterTally) -> int:
        sweep = self._sweeps[source.table.name]
        found, caught_up = await self._walk(source, sweep, "head", HEAD_ROWS_PER_PASS, wrap=False)
        tally.full = tally.full or not caught_up
        more, _ = await self._walk(source, sweep, "rescan", RESCAN_ROWS_PER_PASS, wrap=True)
        return found + more

    async def _walk(self, source: _Source, sweep: _Sweep, cursor: str, budget: int, *,
                    wrap: bool) -> tuple[int, bool]:
        """Register what the rows after `sweep.<cursor>` call for, at most `budget` rows; how
        many were new, and whether the table's end was reached (`wrap`: start over next time)."""
        found = 0
        while budget > 0:
            page = await self._page(source, getattr(sweep, cursor))
            new = await self._fees.register([r for r in map(source.registered, page) if r])
            found, budget = found + new, budget - len(page)
            last = (_aware(page[-1]["created_at"]), page[-1]["id"]) if page else None
            if len(page) < self._chunk:
                setattr(sweep, cursor, None if wrap else last or getattr(sweep, cursor))
                return found, True
            setattr(sweep, cursor, last)
            await asyncio.sleep(0)  # let the loop serve calls between steps
        return found, False

    async def _page(self, source: _Source, after: tuple[datetime, str] | None) -> list[Any]:
        async with self._ledger.reading() as conn:
            return list((await conn.execute(source.page(after, self._chunk))).mappings().all())

    async def _read(self, item: Waiting, tally: MeterTally) -> None:
        rpc = self._rpcs[item.network]
        try:
            reading = await read_fee(item.network, item.tx_id, rpc)
        except ProbeError as exc:
            log.warning("chain fee of %s on %s: asking the node failed (%s); asking again later",
                        item.tx_id, item.network, exc)
            await self._fees.postpone(item, f"the node could not be asked: {exc}",
                                      retry_seconds=self._retry, give_up=False)
            tally.waiting += 1
            return
        if reading is not None:
            wrote = await self._fees.record(item.network, item.tx_id, reading)
            tally.recorded += wrote  # (after the await: reads run concurrently)
            return
        give_up = (_now() - item.expected_at).total_seconds() >= self._give_up
        await self._fees.postpone(item, "the node does not know this transaction (yet)",
                                  retry_seconds=self._retry, give_up=give_up)
        if give_up:
            tally.missing += 1
            log.warning("chain fee of %s on %s: the node still does not know it %.0f s after it "
                        "was registered; given up (missing)", item.tx_id, item.network,
                        self._give_up)
        else:
            tally.waiting += 1


__all__ = [
    "ETH", "NATIVE_TOKENS", "SOL", "ChainFeeMeter", "ChainFees", "FeeKind",
    "FeePrices", "FeeReading", "MeterTally", "NativeToken", "Waiting", "expect", "native_token",
    "read_fee", "tx_key",
]
