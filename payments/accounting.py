"""Accounting over the payment ledger: revenue, upstream cost and margin by skill, network and
day; the payments themselves, filtered and paged; what is pending and what failed.

Money is exact. Revenue is what the settled payments were charged (USDC, 6 decimals), summed as
integers: `charged_atomic` where the call was charged less than its payment authorized (an upto
settlement moved only that; an exact payment on Solana gets the rest back, payments/refunds.py),
else `amount_atomic`. So it is net of refunds; what goes back is shown beside it, confirmed
(`refunded_atomic`) or not yet (`refund_owed_atomic`: owed, or in a transfer not confirmed
yet). Upstream cost is `upstream_cost_usd`, an exact decimal (NUMERIC on PostgreSQL, decimal
text on SQLite, where SQL's SUM() would turn it into a binary float). So the cost is summed by
PostgreSQL's NUMERIC sum, and on SQLite by `paywire_decimal_sum`, an aggregate registered on the
connection that adds Decimals in a context that traps any rounding. The database groups and
streams the rows; memory holds one line per group, whatever the number of payments.

Days are UTC days of `created_at` (when the payment was claimed; a settlement follows within the
call, and the ledger keeps no separate settlement time), and a period is [since, until).

Margin is honest: revenue - the settled calls' upstream cost - `unbilled_cost_usd`, the upstream
cost of calls that failed after the upstream billed (released or failed rows with a cost) - the
chain fees paywire's transactions paid (`paywire_chain_fees`, read from the chain by
payments/chain_fees.py), in USD where the operator set the native token's price (`FeePrices`);
fees of a token without a price are shown in its smallest unit and named `chain_fees_unpriced`,
left out of the margin. A fee counts on the UTC day of its row's `at`: a settlement's is its
payment's `created_at` (its revenue's day), a refund's its refund's, a channel transaction's when
it was registered. Fees join the revenue groups by network and day, and by skill through their
payment (a settlement's); fees of no payment (refunds, channel claims) form a group of no skill.

SQLite reads run on a stdlib connection in a worker thread (a month's report must not hold the
event loop); PostgreSQL's on the async engine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal, Inexact, InvalidOperation, Rounded
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    String,
    and_,
    case,
    cast,
    create_engine,
    event,
    func,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import ColumnElement, Select

from .chain_fees import NATIVE_TOKENS, SOL, FeePrices, NativeToken, native_token
from .ledger_schema import (
    UNFINISHED,
    ChainFeeState,
    PaymentState,
    RefundState,
    chain_fees_table,
    payments_table,
    refunds_table,
)
from .money import USDC_DECIMALS, atomic_to_usd
from .refund_ledger import OWED_AMOUNT, owed_clause

__all__ = [
    "GROUPINGS", "Accounting", "AccountingInputError", "Cursor", "FeeLine", "FeePerCall",
    "FeeReport", "FeeSum", "FeeTotal", "PaymentFilter", "PaymentLine", "PaymentPage", "Period",
    "RevenueLine", "RevenueReport", "decimal_text", "fee_column", "parse_by", "parse_moment",
    "parse_month",
]

GROUPINGS = ("skill", "network", "day")
MAX_PAGE = 1000  # payments per page (API and CLI); an export pages through them all
EXPORT_CHUNK = 1000
FAILED_STATES = (PaymentState.RELEASED, PaymentState.FAILED)
ZERO = Decimal(0)

# Adding Decimals: 100 digits of precision, and any rounding raises instead of happening.
EXACT = Context(prec=100, traps=[Inexact, Rounded, InvalidOperation])


class AccountingInputError(ValueError):
    """A filter, period or grouping that cannot be used; `field` names it (the CLI's option or
    the API's query parameter of the same name), the message says what would do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def decimal_text(amount: Decimal) -> str:
    """Plain decimal text, exact, without exponent or trailing zeros: `0.0000001`, `12.5`, `0`.
    (`format(x, "f")` prints every digit; `normalize()` would round to the context's precision.)"""
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _add(a: Decimal, b: Decimal) -> Decimal:
    return EXACT.add(a, b)


# -- parsing what operators type -------------------------------------------------------------------

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def parse_moment(text: str, field: str) -> datetime:
    """`2026-11-01` (midnight UTC) or an ISO 8601 time (`2026-11-01T12:00:00Z`; without an
    offset it is UTC), as an aware UTC datetime."""
    value = text.strip()
    if not value or len(value) > 40:
        raise AccountingInputError(field, f"expected a date such as 2026-11-01 or a time such as "
                                          f"2026-11-01T12:00:00Z, got {text[:40]!r}")
    try:
        if len(value) == 10:
            moment = datetime.combine(date.fromisoformat(value), datetime.min.time())
        else:
            moment = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise AccountingInputError(field, f"expected a date such as 2026-11-01 or a time such as "
                                          f"2026-11-01T12:00:00Z, got {value!r}") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse_month(text: str, field: str = "month") -> tuple[datetime, datetime]:
    """`2026-11` -> [2026-11-01, 2026-12-01) in UTC."""
    found = _MONTH.match(text.strip())
    if not found or not 1 <= int(found.group(2)) <= 12 or int(found.group(1)) < 1970:
        raise AccountingInputError(field, f"expected a month such as 2026-11, got {text[:20]!r}")
    year, month = int(found.group(1)), int(found.group(2))
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def parse_by(text: str | None, field: str = "by") -> tuple[str, ...]:
    """`skill,network,day` (any of them, in any order, each once); empty: no grouping."""
    if text is None or not text.strip():
        return ()
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in GROUPINGS]
    if unknown or len(names) > len(GROUPINGS):
        raise AccountingInputError(field, f"group by any of {', '.join(GROUPINGS)} (comma-separated), "
                                          f"got {text[:60]!r}")
    if len(set(names)) != len(names):
        raise AccountingInputError(field, f"name each grouping once, got {text[:60]!r}")
    return names


@dataclass(frozen=True)
class Period:
    """[since, until) in UTC; either end may be open."""

    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            moment = getattr(self, name)
            if moment is not None and moment.tzinfo is None:
                raise AccountingInputError(name, "a time needs a time zone (UTC is meant)")
            if moment is not None:  # bound as UTC: SQLite stores UTC text without an offset
                object.__setattr__(self, name, moment.astimezone(UTC))
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise AccountingInputError("until", f"must be after since ({self.since.isoformat()}), "
                                                f"got {self.until.isoformat()}")

    @staticmethod
    def of(*, since: str | None = None, until: str | None = None, month: str | None = None
           ) -> Period:
        """From an operator's text: `month` alone, or `since` and/or `until`."""
        if month:
            if since or until:
                raise AccountingInputError("month", "give either month or since/until, not both")
            start, end = parse_month(month)
            return Period(start, end)
        return Period(parse_moment(since, "since") if since else None,
                      parse_moment(until, "until") if until else None)

    def as_dict(self) -> dict[str, str | None]:
        return {"since": _iso(self.since), "until": _iso(self.until)}


def _iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC with a `Z`."""
    if moment is None:
        return None
    return _aware(moment).isoformat().replace("+00:00", "Z")


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# -- chain fees ------------------------------------------------------------------------------------

def fee_column(token: NativeToken) -> str:
    """A token's fee column: `chain_fees_eth_wei`, `chain_fees_sol_lamports`."""
    return f"chain_fees_{token.symbol.lower()}_{token.unit}"


@dataclass(frozen=True)
class FeeSum:
    """The recorded chain fees of one group: per native token in its smallest unit (exact), and
    in USD for the tokens whose price is set (the rest named in `unpriced`)."""

    transactions: int = 0
    native: tuple[tuple[str, int], ...] = ()  # (token symbol, amount), by symbol
    usd: Decimal = ZERO
    unpriced: tuple[str, ...] = ()

    @staticmethod
    def of(network: str, transactions: int, fee: int, prices: FeePrices) -> FeeSum:
        token = native_token(network)
        usd = prices.usd_of(token, fee)
        return FeeSum(transactions, ((token.symbol, fee),), usd if usd is not None else ZERO,
                      () if usd is not None or not fee else (token.symbol,))

    def amount(self, token: NativeToken) -> int:
        return dict(self.native).get(token.symbol, 0)

    def plus(self, other: FeeSum) -> FeeSum:
        native = dict(self.native)
        for symbol, amount in other.native:
            native[symbol] = native.get(symbol, 0) + amount
        return FeeSum(self.transactions + other.transactions, tuple(sorted(native.items())),
                      _add(self.usd, other.usd), tuple(sorted({*self.unpriced, *other.unpriced})))

    def figures(self) -> dict[str, Any]:
        """Native amounts as decimal strings (wei passes JavaScript's exact integers); the tokens
        without a price with their amounts (in neither `chain_fees_usd` nor the margin)."""
        return {"chain_fee_transactions": self.transactions,
                **{fee_column(token): str(self.amount(token)) for token in NATIVE_TOKENS},
                "chain_fees_usd": decimal_text(self.usd),
                "chain_fees_unpriced": [
                    {"token": token.symbol, "amount": str(self.amount(token)), "unit": token.unit}
                    for token in NATIVE_TOKENS if token.symbol in self.unpriced]}


@dataclass(frozen=True)
class FeeLine:
    """The recorded fees of one day, network and kind of transaction."""

    day: str
    network: str
    kind: str
    transactions: int = 0
    reverted: int = 0  # transactions that failed on chain: their gas was paid all the same
    gas_used: int = 0  # EVM
    fee: int = 0  # in the network's native token's smallest unit
    usd: Decimal | None = None  # None: the token has no price

    def as_dict(self) -> dict[str, Any]:
        token = native_token(self.network)
        return {"day": self.day, "network": self.network, "kind": self.kind,
                "transactions": self.transactions, "reverted": self.reverted,
                "gas_used": self.gas_used if token is not SOL else None,  # Solana: no gas
                "fee": str(self.fee), "token": token.symbol,
                "unit": token.unit, "fee_usd": _text_or_none(self.usd)}


@dataclass(frozen=True)
class FeePerCall:
    """One day and network: every kind of transaction's gas and fees over its paid calls (a
    channel's claims amortized over the calls they carried)."""

    day: str
    network: str
    paid_calls: int
    transactions: int
    gas_used: int
    fee: int
    usd: Decimal | None

    def per_call(self, amount: Decimal | int | None, places: str) -> Decimal | None:
        """A per-call figure, rounded to `places` (a display figure; the totals are exact)."""
        if amount is None or not self.paid_calls:
            return None
        return (Decimal(amount) / self.paid_calls).quantize(Decimal(places))

    def as_dict(self) -> dict[str, Any]:
        token = native_token(self.network)
        gas = self.per_call(self.gas_used, "0.01") if token is not SOL else None  # Solana: no gas
        return {"day": self.day, "network": self.network, "paid_calls": self.paid_calls,
                "transactions": self.transactions,
                "gas_used": self.gas_used if token is not SOL else None,
                "fee": str(self.fee), "token": token.symbol, "unit": token.unit,
                "fee_usd": _text_or_none(self.usd), "gas_per_paid_call": _text_or_none(gas),
                "fee_per_paid_call": _text_or_none(self.per_call(self.fee, "0.01")),
                "fee_usd_per_paid_call": _text_or_none(self.per_call(self.usd, "1E-9"))}


@dataclass(frozen=True)
class FeeReport:
    """The period's chain fees by day, network and kind; per paid call by day and network; how
    many transactions wait to be read (or were given up), and the prices used."""

    lines: list[FeeLine]
    per_call: list[FeePerCall]
    waiting: int
    missing: int
    prices: FeePrices

    def as_dict(self) -> dict[str, Any]:
        return {"prices_usd": self.prices.as_dict(), "lines": [line.as_dict() for line in self.lines],
                "per_paid_call": [line.as_dict() for line in self.per_call],
                "waiting": self.waiting, "missing": self.missing}


@dataclass(frozen=True)
class FeeTotal:
    """All of one network's, kind's and state's transactions (for /metrics)."""

    network: str
    kind: str
    state: str
    transactions: int
    gas_used: int
    fee: int


def _text_or_none(amount: Decimal | None) -> str | None:
    return None if amount is None else decimal_text(amount)


# -- revenue ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RevenueLine:
    """One group's figures (the groups not used are None). Revenue in atomic USDC units (exact
    int); costs exact Decimal USD."""

    skill: str | None = None
    network: str | None = None
    day: str | None = None
    calls: int = 0  # settled payments
    revenue_atomic: int = 0  # what they were charged (net of refunds)
    upstream_cost_usd: Decimal = ZERO  # of the settled calls
    failed_calls: int = 0  # released (nothing moved) or failed
    unbilled_cost_usd: Decimal = ZERO  # what the failed calls still cost upstream
    pending_calls: int = 0  # claimed, settling, pending: may still move
    pending_atomic: int = 0
    refunded_atomic: int = 0  # given back to payers (Solana refunds, confirmed)
    refund_owed_atomic: int = 0  # owed back, not confirmed yet (or refunds are off)
    chain_fees: FeeSum = FeeSum()  # what this group's transactions paid in fees

    @property
    def revenue_usd(self) -> Decimal:
        return atomic_to_usd(self.revenue_atomic, USDC_DECIMALS)

    @property
    def margin_usd(self) -> Decimal:
        """Revenue - upstream cost - unbilled cost - the chain fees priced in USD."""
        costs = _add(_add(self.upstream_cost_usd, self.unbilled_cost_usd), self.chain_fees.usd)
        return EXACT.subtract(self.revenue_usd, costs)

    def plus(self, other: RevenueLine) -> RevenueLine:
        return replace(
            self, calls=self.calls + other.calls, revenue_atomic=self.revenue_atomic + other.revenue_atomic,
            upstream_cost_usd=_add(self.upstream_cost_usd, other.upstream_cost_usd),
            failed_calls=self.failed_calls + other.failed_calls,
            unbilled_cost_usd=_add(self.unbilled_cost_usd, other.unbilled_cost_usd),
            pending_calls=self.pending_calls + other.pending_calls,
            pending_atomic=self.pending_atomic + other.pending_atomic,
            refunded_atomic=self.refunded_atomic + other.refunded_atomic,
            refund_owed_atomic=self.refund_owed_atomic + other.refund_owed_atomic,
            chain_fees=self.chain_fees.plus(other.chain_fees))

    def figures(self) -> dict[str, Any]:
        """The numbers as JSON: amounts as exact decimal strings, atomic amounts as integers."""
        return {
            "calls": self.calls, "revenue_atomic": self.revenue_atomic,
            "revenue_usd": decimal_text(self.revenue_usd),
            "upstream_cost_usd": decimal_text(self.upstream_cost_usd),
            "failed_calls": self.failed_calls,
            "unbilled_cost_usd": decimal_text(self.unbilled_cost_usd),
            **self.chain_fees.figures(),
            "margin_usd": decimal_text(self.margin_usd),
            "pending_calls": self.pending_calls, "pending_atomic": self.pending_atomic,
            "refunded_atomic": self.refunded_atomic,
            "refund_owed_atomic": self.refund_owed_atomic,
        }

    def active(self) -> bool:
        """Some payment or transaction counts in this group."""
        return bool(self.calls or self.failed_calls or self.pending_calls
                    or self.chain_fees.transactions)

    def keys(self, by: Sequence[str]) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in by}


@dataclass(frozen=True)
class RevenueReport:
    by: tuple[str, ...]
    period: Period
    lines: list[RevenueLine]
    total: RevenueLine
    prices: FeePrices = FeePrices()  # the native tokens' USD prices its chain fees are priced at

    def as_dict(self) -> dict[str, Any]:
        return {"by": list(self.by), "period": self.period.as_dict(), "currency": "USD",
                "asset": "USDC", "decimals": USDC_DECIMALS, "day": "UTC day of created_at",
                "chain_fees_prices_usd": self.prices.as_dict(),
                "lines": [line.keys(self.by) | line.figures() for line in self.lines],
                "total": self.total.figures()}


# -- payments --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PaymentFilter:
    """Which payments: each filter optional, all of them must hold."""

    state: str | None = None
    skill: str | None = None
    network: str | None = None
    payer: str | None = None
    tx: str | None = None
    period: Period = field(default_factory=Period)

    LIMITS = {"skill": 200, "network": 64, "payer": 128, "tx": 130}

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in {s.value for s in PaymentState}:
            raise AccountingInputError("state", f"one of {', '.join(s.value for s in PaymentState)}, "
                                                f"got {self.state[:20]!r}")
        for name, most in self.LIMITS.items():
            value = getattr(self, name)
            if value is not None and (not value or len(value) > most or not value.isprintable()):
                raise AccountingInputError(name, f"expected 1 to {most} printable characters")

    def where(self) -> list[ColumnElement[bool]]:
        t = payments_table
        clauses: list[ColumnElement[bool]] = _in_period(self.period)
        if self.state is not None:
            clauses.append(t.c.state == self.state)
        if self.skill is not None:
            clauses.append(t.c.skill_id == self.skill)
        if self.network is not None:
            clauses.append(t.c.network == self.network)
        if self.payer is not None:  # the ledger keys EVM payers in lower case
            clauses.append(t.c.payer == (self.payer.lower() if self.payer.startswith("0x")
                                         else self.payer))
        if self.tx is not None:
            clauses.append(t.c.tx_hash == self.tx)
        return clauses


@dataclass(frozen=True)
class PaymentLine:
    """A payment as the operator reads it (never the signature or the kept result)."""

    id: str
    created_at: datetime
    updated_at: datetime
    state: str
    skill: str
    network: str
    payer: str
    amount_atomic: int
    asset: str
    pay_to: str
    tx_hash: str | None
    upstream_cost_usd: Decimal | None
    latency_ms: int | None
    delivered_at: datetime | None
    lease_until: datetime | None
    error: str | None

    COLUMNS = ("id", "created_at", "state", "skill", "network", "payer", "amount_atomic",
               "amount_usd", "asset", "pay_to", "tx_hash", "upstream_cost_usd", "latency_ms",
               "delivered_at", "updated_at", "error")

    @property
    def amount_usd(self) -> Decimal:
        return atomic_to_usd(self.amount_atomic, USDC_DECIMALS)

    def as_dict(self) -> dict[str, Any]:
        """JSON: amounts as exact strings (and the atomic integer), times ISO 8601 UTC."""
        return {
            "id": self.id, "created_at": _iso(self.created_at), "state": self.state,
            "skill": self.skill, "network": self.network, "payer": self.payer,
            "amount_atomic": self.amount_atomic, "amount_usd": decimal_text(self.amount_usd),
            "asset": self.asset, "pay_to": self.pay_to, "tx_hash": self.tx_hash,
            "upstream_cost_usd": (decimal_text(self.upstream_cost_usd)
                                  if self.upstream_cost_usd is not None else None),
            "latency_ms": self.latency_ms, "delivered_at": _iso(self.delivered_at),
            "updated_at": _iso(self.updated_at), "error": self.error,
        }

    def age_seconds(self, now: datetime) -> float:
        return (now - _aware(self.created_at)).total_seconds()

    def lease_left_seconds(self, now: datetime) -> float | None:
        return None if self.lease_until is None else (_aware(self.lease_until) - now).total_seconds()


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last payment's (created_at, id). Opaque to clients."""

    created_at: datetime
    id: str

    def encode(self) -> str:
        raw = f"{_aware(self.created_at).isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str, field: str = "after") -> Cursor:
        problem = AccountingInputError(field, "not a cursor this paywire gave (pass `next` from the "
                                              "previous page as it is)")
        if not text or len(text) > 200:
            raise problem
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            moment, _, row_id = raw.partition("|")
            created = datetime.fromisoformat(moment)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise problem from None
        if created.tzinfo is None or not row_id or len(row_id) > 36:
            raise problem
        return Cursor(created.astimezone(UTC), row_id)


@dataclass(frozen=True)
class PaymentPage:
    payments: list[PaymentLine]
    next: Cursor | None  # None: this was the last page


# -- the queries -----------------------------------------------------------------------------------

def _in_period(period: Period, moment: ColumnElement[Any] = payments_table.c.created_at
               ) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = []
    if period.since is not None:
        clauses.append(moment >= period.since)
    if period.until is not None:
        clauses.append(moment < period.until)
    return clauses


class _DecimalSum:
    """SQLite aggregate: the exact sum of decimal text (NULL when every value is NULL)."""

    def __init__(self) -> None:
        self.total: Decimal | None = None

    def step(self, value: Any) -> None:
        if value is None:
            return
        self.total = _add(self.total if self.total is not None else ZERO, Decimal(str(value)))

    def finalize(self) -> str | None:
        return None if self.total is None else str(self.total)


def _sqlite_connection(dbapi_conn: Any, _record: Any = None) -> None:
    dbapi_conn.create_aggregate("paywire_decimal_sum", 1, _DecimalSum)
    dbapi_conn.execute("PRAGMA busy_timeout=30000")
    dbapi_conn.execute("PRAGMA query_only=ON")  # accounting only reads


class Accounting:
    """The accounting queries over the ledger's database (the ledger's async engine); `prices`:
    the native tokens' USD prices, for the chain fees."""

    def __init__(self, engine: AsyncEngine, prices: FeePrices | None = None) -> None:
        self._engine = engine
        self.prices = prices or FeePrices()
        self._sqlite: Engine | None = None
        if engine.dialect.name == "sqlite":
            # A connection per query (NullPool): nothing to close, and nothing held between the
            # operator's rare reads; opening a SQLite file takes well under a millisecond.
            self._sqlite = create_engine(engine.url.set(drivername="sqlite+pysqlite"),
                                         poolclass=NullPool,
                                         connect_args={"check_same_thread": False})
            event.listen(self._sqlite, "connect", _sqlite_connection)

    async def _all(self, statement: Select[Any]) -> list[Any]:
        if self._sqlite is not None:
            sync = self._sqlite

            def run() -> list[Any]:
                with sync.connect() as conn:
                    return list(conn.execute(statement).mappings())
            return await asyncio.to_thread(run)
        async with self._engine.connect() as conn:
            return list((await conn.execute(statement)).mappings())

    # -- revenue -------------------------------------------------------------------------------

    def _day(self, moment: ColumnElement[Any] = payments_table.c.created_at) -> ColumnElement[Any]:
        if self._sqlite is not None:  # stored as 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC
            return func.substr(moment, 1, 10)
        return func.to_char(func.timezone("UTC", moment), "YYYY-MM-DD")

    def _cost_sum(self, value: ColumnElement[Any]) -> ColumnElement[Any]:
        if self._sqlite is not None:
            return func.paywire_decimal_sum(value, type_=String)
        return func.sum(value)

    async def revenue(self, *, by: Sequence[str] = (), period: Period | None = None) -> RevenueReport:
        """Revenue, cost and margin per group (`by`: any of skill, network, day), in a period."""
        period = period or Period()
        unknown = [n for n in by if n not in GROUPINGS]
        if unknown:
            raise AccountingInputError("by", f"group by any of {', '.join(GROUPINGS)}, got {unknown}")
        t, r = payments_table, refunds_table
        keys: dict[str, ColumnElement[Any]] = {
            "skill": t.c.skill_id, "network": t.c.network, "day": self._day()}
        settled = t.c.state == PaymentState.SETTLED
        failed = t.c.state.in_(FAILED_STATES)
        unfinished = t.c.state.in_(UNFINISHED)
        zero = literal(0)
        owed, confirmed = owed_clause(), r.c.state == RefundState.CONFIRMED
        charged = func.coalesce(t.c.charged_atomic, t.c.amount_atomic)
        columns = [keys[name].label(name) for name in by] + [
            func.count(case((settled, 1))).label("calls"),
            func.coalesce(func.sum(case((settled, charged), else_=zero)), 0).label("revenue"),
            self._cost_sum(case((settled, t.c.upstream_cost_usd))).label("cost"),
            func.count(case((failed, 1))).label("failed"),
            self._cost_sum(case((failed, t.c.upstream_cost_usd))).label("unbilled"),
            func.count(case((unfinished, 1))).label("pending"),
            func.coalesce(func.sum(case((unfinished, t.c.amount_atomic), else_=zero)), 0)
            .label("pending_atomic"),
            func.coalesce(func.sum(case((and_(owed, confirmed), OWED_AMOUNT), else_=zero)), 0)
            .label("refunded"),
            func.coalesce(func.sum(case((and_(owed, or_(r.c.id.is_(None), ~confirmed)),
                                         OWED_AMOUNT), else_=zero)), 0).label("refund_owed"),
        ]
        statement = (select(*columns).select_from(t.outerjoin(r, t.c.refund_id == r.c.id))
                     .where(and_(true(), *_in_period(period))))
        if by:
            grouped = [keys[name] for name in by]
            statement = statement.group_by(*grouped).order_by(*grouped)
        fee_groups = await self._fee_groups(period)
        fees = self._fees_by(by, fee_groups)
        lines: list[RevenueLine] = []
        for row in await self._all(statement):
            keys = {name: (str(row[name]) if row[name] is not None else None) for name in by}
            line = RevenueLine(
                **keys, calls=int(row["calls"]), revenue_atomic=int(row["revenue"]),
                upstream_cost_usd=_decimal(row["cost"]), failed_calls=int(row["failed"]),
                unbilled_cost_usd=_decimal(row["unbilled"]), pending_calls=int(row["pending"]),
                pending_atomic=int(row["pending_atomic"]), refunded_atomic=int(row["refunded"]),
                refund_owed_atomic=int(row["refund_owed"]),
                chain_fees=fees.pop(tuple(keys.values()), FeeSum()))
            if by and not line.active():
                continue
            lines.append(line)
        if by and fees:  # groups with fees and no payment (a refund's day, channel claims)
            lines += [RevenueLine(**dict(zip(by, key, strict=True)), chain_fees=fee)
                      for key, fee in fees.items()]
            lines.sort(key=lambda line: [(v is None, v or "") for v in line.keys(by).values()])
        total = RevenueLine()
        for line in lines:
            total = total.plus(line)
        if not by:  # the one line is the total; no payments: no line
            lines = [total] if total.active() else []
        return RevenueReport(tuple(by), period, lines, total, self.prices)

    # -- chain fees ----------------------------------------------------------------------------

    async def chain_fees(self, period: Period | None = None, *, per_call: bool = True
                         ) -> FeeReport:
        """The period's chain fees by day, network and kind, and (`per_call`) per paid call."""
        period = period or Period()
        return await self._fee_report(period, await self._fee_groups(period), per_call)

    async def _fee_groups(self, period: Period) -> list[Any]:
        """Recorded fees by day, network, kind and skill (a settlement's payment's; else None)."""
        f = chain_fees_table
        day = self._day(f.c.at)
        return await self._fee_sums(lambda fee_sum: (
            select(day.label("day"), f.c.network, f.c.kind, f.c.skill,
                   func.count().label("n"),
                   func.count(case((f.c.succeeded.is_(False), 1))).label("reverted"),
                   func.coalesce(func.sum(f.c.gas_used), 0).label("gas"),
                   fee_sum(f.c.fee).label("fee"))
            .where(and_(f.c.state == ChainFeeState.RECORDED, *_in_period(period, f.c.at)))
            .group_by(day, f.c.network, f.c.kind, f.c.skill)))

    async def _fee_sums(self, statement: Callable[[Callable[[Any], Any]], Select[Any]]
                        ) -> list[Any]:
        """`statement(fee_sum)` run with an exact sum of the fee column. On SQLite (decimal text)
        its 64-bit integer sum first, 3x faster than the Decimal aggregate, unless a fee has more
        than 18 digits (it would not cast exactly) or a sum passes 2^63 (SQLite raises "integer
        overflow", never a wrong figure): then the Decimal aggregate, exact at any size."""
        if self._sqlite is None:
            return await self._all(statement(func.sum))
        fee = chain_fees_table.c.fee
        fast = statement(lambda column: func.sum(cast(column, BigInteger))).add_columns(
            func.max(func.length(fee)).label("fee_digits"))
        try:
            rows = await self._all(fast)
            if all((row["fee_digits"] or 0) <= 18 for row in rows):
                return rows
        except OperationalError as exc:
            if "integer overflow" not in str(exc):
                raise
        return await self._all(statement(self._cost_sum))

    def _fees_by(self, by: Sequence[str], groups: list[Any]) -> dict[tuple[Any, ...], FeeSum]:
        """The fee groups summed by the report's keys (skill, network, day)."""
        out: dict[tuple[Any, ...], FeeSum] = {}
        for g in groups:
            key = tuple(g[name] for name in by)
            fee = FeeSum.of(g["network"], int(g["n"]), _whole(g["fee"]), self.prices)
            out[key] = out[key].plus(fee) if key in out else fee
        return out

    async def _fee_report(self, period: Period, groups: list[Any], per_call: bool) -> FeeReport:
        lines: dict[tuple[str, str, str], FeeLine] = {}
        for g in groups:
            key = (g["day"], g["network"], g["kind"])
            was = lines.get(key, FeeLine(*key))
            lines[key] = replace(was, transactions=was.transactions + int(g["n"]),
                                 reverted=was.reverted + int(g["reverted"]),
                                 gas_used=was.gas_used + int(g["gas"]),
                                 fee=was.fee + _whole(g["fee"]))
        priced = [replace(line, usd=self.prices.usd_of(native_token(line.network), line.fee))
                  for _, line in sorted(lines.items())]
        calls = await self._per_call(period, priced) if per_call else []
        f = chain_fees_table
        unread = {row["state"]: int(row["n"]) for row in await self._all(
            select(f.c.state, func.count().label("n"))
            .where(and_(f.c.state != ChainFeeState.RECORDED, *_in_period(period, f.c.at)))
            .group_by(f.c.state))}
        return FeeReport(priced, calls, unread.get(ChainFeeState.WAITING, 0),
                         unread.get(ChainFeeState.MISSING, 0), self.prices)

    async def _per_call(self, period: Period, lines: list[FeeLine]) -> list[FeePerCall]:
        """Every kind's fees by day and network, over the settled calls of that day and network."""
        if not lines:  # no fee: no need to count the calls
            return []
        t = payments_table
        day = self._day()
        calls = {(row["day"], row["network"]): int(row["n"]) for row in await self._all(
            select(day.label("day"), t.c.network, func.count().label("n"))
            .where(and_(t.c.state == PaymentState.SETTLED, *_in_period(period)))
            .group_by(day, t.c.network))}
        out: dict[tuple[str, str], FeePerCall] = {}
        for line in lines:
            key = (line.day, line.network)
            was = out.get(key, FeePerCall(*key, calls.get(key, 0), 0, 0, 0, None))
            usd = None if line.usd is None else _add(was.usd or ZERO, line.usd)
            out[key] = replace(was, transactions=was.transactions + line.transactions,
                               gas_used=was.gas_used + line.gas_used, fee=was.fee + line.fee,
                               usd=usd)
        return [out[key] for key in sorted(out)]

    async def fee_totals(self) -> list[FeeTotal]:
        """Every transaction's fee by network, kind and state, since the beginning (/metrics)."""
        f = chain_fees_table
        rows = await self._fee_sums(lambda fee_sum: (
            select(f.c.network, f.c.kind, f.c.state, func.count().label("n"),
                   func.coalesce(func.sum(f.c.gas_used), 0).label("gas"),
                   fee_sum(f.c.fee).label("fee"))
            .group_by(f.c.network, f.c.kind, f.c.state)))
        return [FeeTotal(row["network"], row["kind"], row["state"], int(row["n"]), int(row["gas"]),
                         _whole(row["fee"])) for row in rows]

    # -- payments ------------------------------------------------------------------------------

    async def payments(self, filters: PaymentFilter | None = None, *, limit: int = 50,
                       after: Cursor | None = None, oldest_first: bool = False) -> PaymentPage:
        """One page of payments, newest first (or oldest first), after `after` (keyset paging
        on (created_at, id): a page costs the same wherever it is)."""
        if not 1 <= limit <= MAX_PAGE:
            raise AccountingInputError("limit", f"a whole number from 1 to {MAX_PAGE}, got {limit}")
        filters = filters or PaymentFilter()
        t = payments_table
        clauses = filters.where()
        if after is not None:  # the range first, so the created_at index seeks to the page
            if oldest_first:
                clauses += [t.c.created_at >= after.created_at,
                            or_(t.c.created_at > after.created_at, t.c.id > after.id)]
            else:
                clauses += [t.c.created_at <= after.created_at,
                            or_(t.c.created_at < after.created_at, t.c.id < after.id)]
        order = ([t.c.created_at, t.c.id] if oldest_first
                 else [t.c.created_at.desc(), t.c.id.desc()])
        rows = await self._all(select(*_LINE_COLUMNS).where(and_(true(), *clauses))
                               .order_by(*order).limit(limit + 1))
        lines = [_line(r) for r in rows[:limit]]
        more = len(rows) > limit
        return PaymentPage(lines, Cursor(_aware(lines[-1].created_at), lines[-1].id) if more else None)

    async def every_payment(self, filters: PaymentFilter | None = None,
                            chunk: int = EXPORT_CHUNK) -> AsyncIterator[PaymentLine]:
        """Every matching payment, oldest first, a page at a time (an export of any size)."""
        after: Cursor | None = None
        while True:
            page = await self.payments(filters, limit=chunk, after=after, oldest_first=True)
            for line in page.payments:
                yield line
            if page.next is None:
                return
            after = page.next

    async def pending(self, limit: int = 100) -> list[PaymentLine]:
        """Unfinished settlements (claimed, settling, pending), oldest first."""
        t = payments_table
        return [_line(r) for r in await self._all(
            select(*_LINE_COLUMNS).where(t.c.state.in_(UNFINISHED))
            .order_by(t.c.created_at, t.c.id).limit(_bounded(limit)))]

    async def failures(self, *, period: Period | None = None, limit: int = 50) -> list[PaymentLine]:
        """Released and failed payments (nothing moved), most recently changed first."""
        t = payments_table
        return [_line(r) for r in await self._all(
            select(*_LINE_COLUMNS).where(and_(t.c.state.in_(FAILED_STATES),
                                              *_in_period(period or Period())))
            .order_by(t.c.updated_at.desc(), t.c.id.desc()).limit(_bounded(limit)))]

    async def counts(self) -> dict[str, int]:
        """Payments per state, every state named (0 when none)."""
        t = payments_table
        rows = await self._all(select(t.c.state, func.count().label("n")).group_by(t.c.state))
        found = {str(r["state"]): int(r["n"]) for r in rows}
        return {s.value: found.get(s.value, 0) for s in PaymentState}

    async def summary(self, *, now: datetime | None = None, days: int = 30) -> dict[str, Any]:
        """What the operator page's header shows: the period's totals, the last 24 hours',
        payments by state, and how many failed (24 h) or wait to settle (and how many of those
        are stuck: their lease ran out, the reconciler has not resolved them)."""
        if not 1 <= days <= 366:
            raise AccountingInputError("days", f"a whole number from 1 to 366, got {days}")
        now = _aware(now or datetime.now(UTC))
        period = Period(now - timedelta(days=days), now)
        day = Period(now - timedelta(hours=24), now)
        report, last_day, counts, fees = await asyncio.gather(
            self.revenue(period=period), self.revenue(period=day), self.counts(),
            self.chain_fees(period, per_call=False))
        unfinished = await self.pending(limit=MAX_PAGE)
        stuck = sum(1 for p in unfinished if (p.lease_left_seconds(now) or 0) <= 0)
        return {
            "now": _iso(now), "days": days, "period": period.as_dict(),
            "totals": report.total.figures(), "last_24h": last_day.total.figures(),
            "chain_fees": fees.as_dict(),
            "by_state": counts,
            "failures_24h": last_day.total.failed_calls,
            "pending": {"count": counts["claimed"] + counts["settling"] + counts["pending"],
                        "stuck": stuck,
                        "oldest_age_seconds": round(unfinished[0].age_seconds(now), 1)
                        if unfinished else None},
        }


def _bounded(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise AccountingInputError("limit", f"a whole number from 1 to {MAX_PAGE}, got {limit}")
    return limit


def _decimal(value: Any) -> Decimal:
    return ZERO if value is None else Decimal(str(value))


def _whole(value: Any) -> int:
    """An exact sum of whole numbers (NUMERIC on PostgreSQL, decimal text on SQLite)."""
    return 0 if value is None else int(Decimal(str(value)))


_T = payments_table
_LINE_COLUMNS = (_T.c.id, _T.c.created_at, _T.c.updated_at, _T.c.state, _T.c.skill_id, _T.c.network,
                 _T.c.payer, _T.c.amount_atomic, _T.c.asset, _T.c.pay_to, _T.c.tx_hash,
                 _T.c.upstream_cost_usd, _T.c.latency_ms, _T.c.delivered_at, _T.c.lease_until,
                 _T.c.error)


def _line(row: Mapping[str, Any]) -> PaymentLine:
    return PaymentLine(
        id=row["id"], created_at=_aware(row["created_at"]), updated_at=_aware(row["updated_at"]),
        state=str(row["state"]), skill=row["skill_id"], network=row["network"], payer=row["payer"],
        amount_atomic=int(row["amount_atomic"]), asset=row["asset"], pay_to=row["pay_to"],
        tx_hash=row["tx_hash"], upstream_cost_usd=row["upstream_cost_usd"],
        latency_ms=row["latency_ms"],
        delivered_at=_aware(row["delivered_at"]) if row["delivered_at"] is not None else None,
        lease_until=_aware(row["lease_until"]) if row["lease_until"] is not None else None,
        error=row["error"][:500] if row["error"] else None)
