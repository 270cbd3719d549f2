"""`paywire ledger`: what the payment ledger holds, for an operator at a terminal.

Counts by state; the unfinished payments (claimed, settling, pending) with their age, lease and
transaction, marked "stuck" once their lease ran out (the reconciler has not settled them yet:
its chain could not be asked, or the payment may still move); the Solana refunds, in total and
by payer (owed: not in a transfer yet; sending: in one not confirmed yet; confirmed); the chain
fees paywire's transactions paid, by network and kind (in the native token's smallest unit, and in
USD where its price is set), with how many wait to be read; the batch-settlement channels (per
network and token: by state, deposits, charges, claims, the unclaimed rest, the escrow left, the
next claim; then the channels with the most unclaimed); federation, once any upstream seller
was paid (per seller: paid out, earned on the calls resold, lost); what the reconciler did; or
the latest payments in one state. `--json` prints the same as one JSON document.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from federation.store import FederationStore, SellerTotals
from payments.accounting import Accounting, FeeTotal, decimal_text
from payments.chain_fees import FeePrices, native_token
from payments.channel_report import MAX_LISTED, ChannelReport, read_channels
from payments.ledger import Ledger, PaymentRow
from payments.ledger_schema import ChainFeeState, PaymentState
from payments.refund_ledger import PayerRefunds, RefundLedger

REFUND_PAYERS = 20  # payers listed (those owed the most first); --json lists up to --limit
CHANNELS_LISTED = 20  # channels listed (the most unclaimed first); --json lists up to --limit


def _age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = (now - (moment if moment.tzinfo else moment.replace(tzinfo=UTC))).total_seconds()
    if abs(seconds) < 120:
        return f"{seconds:.0f}s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _row(row: PaymentRow, now: datetime) -> dict[str, Any]:
    return {"id": row.id, "state": str(row.state), "network": row.network, "payer": row.payer,
            "skill": row.skill_id, "amount_atomic": row.amount_atomic,
            "transaction": row.tx_hash, "owner": row.owner,
            "age": _age(row.created_at, now),
            "lease_left_seconds": round(row.lease_left(now), 1) if row.lease_until else None,
            "stuck": row.lease_left(now) <= 0, "error": row.error}


async def report(ledger: Ledger, *, state: str | None = None, events: bool = False,
                 limit: int = 50, as_json: bool = False, prices: FeePrices | None = None) -> str:
    """The text (or JSON) `paywire ledger` prints; `prices`: the native tokens' USD prices."""
    now = datetime.now(UTC)
    if state is not None:
        rows = [_row(r, now) for r in await ledger.recent(state=state, limit=limit)]
        return json.dumps(rows, indent=2) if as_json else _table(rows, f"latest {state} payments")
    if events:
        found = await ledger.events(limit=limit)
        shaped = [{"at": e["at"].isoformat(), "payment": e["payment_row"], "actor": e["actor"],
                   "change": f"{e['from_state']} -> {e['to_state']}", "detail": e["detail"]}
                  for e in found]
        if as_json:
            return json.dumps(shaped, indent=2)
        if not shaped:
            return "the reconciler has not changed any payment"
        return "\n".join(f"{e['at']}  {e['payment']}  {e['change']:<22} {e['detail']}"
                         for e in shaped)
    counts = await ledger.counts()
    unfinished = [_row(r, now) for r in await ledger.unfinished(limit)]
    refunds, payers = await RefundLedger(ledger).by_payer(limit)
    prices = prices or FeePrices()
    fees = [_fee(total, prices) for total in await Accounting(ledger.engine, prices).fee_totals()]
    channels = await read_channels(ledger.engine, limit=max(0, min(limit, MAX_LISTED)))
    sellers = await FederationStore(ledger).seller_totals()
    if as_json:
        return json.dumps({"by_state": {k: {"payments": n, "amount_atomic": a}
                                        for k, (n, a) in counts.items()},
                           "unfinished": unfinished,
                           "refunds": {"total": refunds.as_dict() | {"payer": None},
                                       "by_payer": [p.as_dict() for p in payers]},
                           "chain_fees": fees, "channels": channels.as_dict(),
                           "federation": {"by_seller": [seller_json(t) for t in sellers]}},
                          indent=2)
    lines = ["payments by state:"]
    for name in PaymentState:
        n, amount = counts.get(name.value, (0, 0))
        if n or name in (PaymentState.SETTLED, PaymentState.PENDING):
            lines.append(f"  {name.value:<9} {n:>8}  {amount:>16} atomic units")
    stuck = sum(1 for r in unfinished if r["stuck"])
    lines.append(f"unfinished: {len(unfinished)} ({stuck} stuck: lease ran out, not reconciled yet)")
    if unfinished:
        lines.append(_table(unfinished, "unfinished payments, oldest first"))
    lines += _refund_lines(refunds, payers[:REFUND_PAYERS])
    lines += _fee_lines(fees)
    lines += _channel_lines(channels, now)
    if sellers:
        lines += seller_lines(sellers)
    return "\n".join(lines)


def seller_json(t: SellerTotals) -> dict[str, Any]:
    """One upstream seller's totals, amounts as exact decimal strings."""
    return {"seller": t.seller, "paid_out_usd": decimal_text(t.paid_out_usd),
            "earned_usd": decimal_text(t.earned_usd), "lost_usd": decimal_text(t.lost_usd),
            "calls": t.calls, "lost_calls": t.lost_calls}


def seller_lines(sellers: list[SellerTotals]) -> list[str]:
    """Federation per upstream seller (USD, all time): paid out for the calls it answered,
    earned on them (what their callers were charged less what they cost), lost (paid with no
    answer kept: the operator's loss); then the totals."""
    lines = ["federation, per upstream seller (USD, all time; earned: what the calls' callers "
             "were charged less what the seller was paid for them; lost: paid with no answer):",
             f"  {'seller':<48} {'calls':>7} {'paid out':>14} {'earned':>14} {'lost':>14} "
             f"{'lost calls':>10}"]
    for t in [*sellers, SellerTotals(
            "(total)", sum((t.paid_out_usd for t in sellers), Decimal(0)),
            sum((t.lost_usd for t in sellers), Decimal(0)),
            sum((t.earned_usd for t in sellers), Decimal(0)),
            sum(t.calls for t in sellers), sum(t.lost_calls for t in sellers))]:
        lines.append(f"  {t.seller:<48} {t.calls:>7} {decimal_text(t.paid_out_usd):>14} "
                     f"{decimal_text(t.earned_usd):>14} {decimal_text(t.lost_usd):>14} "
                     f"{t.lost_calls:>10}")
    return lines


def _fee(total: FeeTotal, prices: FeePrices) -> dict[str, Any]:
    """One network's, kind's and state's transactions since the beginning (`fee` in the native
    token's smallest unit, as a string: wei passes JavaScript's exact integers)."""
    token = native_token(total.network)
    recorded = total.state == ChainFeeState.RECORDED
    usd = prices.usd_of(token, total.fee) if recorded else None
    return {"network": total.network, "kind": total.kind, "state": total.state,
            "transactions": total.transactions, "gas_used": total.gas_used if recorded else None,
            "fee": str(total.fee) if recorded else None, "unit": token.unit,
            "fee_usd": decimal_text(usd) if usd is not None else None}


def _fee_lines(fees: list[dict[str, Any]]) -> list[str]:
    """The chain fees by network and kind; the transactions whose fee is not read yet."""
    if not fees:
        return ["chain fees: no transaction yet"]
    lines = ["chain fees (all time; fee in the native token's smallest unit, USD where its price "
             "is set):", f"  {'network':<40} {'kind':<16} {'transactions':>12} {'gas used':>12} "
             f"{'fee':>22} {'unit':<8} {'USD':>14}"]
    for f in fees:
        if f["state"] == ChainFeeState.RECORDED:
            lines.append(f"  {f['network']:<40} {f['kind']:<16} {f['transactions']:>12} "
                         f"{f['gas_used'] or '-':>12} {f['fee']:>22} {f['unit']:<8} "
                         f"{f['fee_usd'] or '-':>14}")
    why = {ChainFeeState.WAITING: "not read yet: read from the chain in the background",
           ChainFeeState.MISSING: "given up: the node never knew them"}
    lines += [f"  {f['network']:<40} {f['kind']:<16} {f['transactions']:>12} {why[f['state']]}"
              for f in fees if f["state"] != ChainFeeState.RECORDED]
    return lines


def _channel_lines(report: ChannelReport, now: datetime) -> list[str]:
    """The channels per network and token, then those with the most unclaimed (atomic units)."""
    if not report.totals:
        return ["channels (batch-settlement): none"]

    def when(moment: datetime | None) -> str:
        return moment.strftime("%Y-%m-%d %H:%M:%S") if moment is not None else "-"

    lines = ["channels (batch-settlement), in the token's atomic units (USDC: 10^-6 USD); unclaimed: "
             "charged, not claimed on chain yet; escrow: deposited, not charged yet:"]
    for t in report.totals:
        states = ", ".join(f"{n} {state}" for state, n in t.by_state if n)
        lines += [f"  {t.network} {t.token}: {t.channels} channels ({states})",
                  f"    balance {t.balance_atomic}  charged {t.charged_atomic}  claimed "
                  f"{t.claimed_atomic}  unclaimed {t.unclaimed_atomic}  escrow {t.escrow_atomic}",
                  f"    next claim (UTC) {when(t.next_claim_at)}  oldest chain read "
                  f"{_age(t.oldest_sync_at, now) + ' ago' if t.oldest_sync_at else '-'}"]
    listed = report.channels[:CHANNELS_LISTED]
    lines += ["  the most unclaimed first:",
              f"  {'channel':<66} {'payer':<42} {'state':<11} {'balance':>12} {'charged':>12} "
              f"{'claimed':>12} {'unclaimed':>12}  next claim (UTC)"]
    for c in listed:
        due = c.claim_due_at if c.unclaimed_atomic > 0 and c.state != "quarantined" else None
        lines.append(f"  {c.channel_id:<66} {c.payer:<42} {c.state:<11} {c.balance_atomic:>12} "
                     f"{c.charged_atomic:>12} {c.claimed_atomic:>12} {c.unclaimed_atomic:>12}  "
                     f"{when(due)}")
    return lines


def _refund_lines(total: PayerRefunds, payers: list[PayerRefunds]) -> list[str]:
    """Solana refunds in atomic units: owed (in no transfer yet), sending (in a transfer not
    confirmed yet), confirmed; by payer, those owed the most first."""
    if not (total.owed_atomic or total.sending_atomic or total.confirmed_atomic):
        return ["refunds (Solana): none owed, none sent"]
    lines = [f"refunds (Solana), atomic units: owed {total.owed_atomic} ({total.owed_payments} "
             f"payments), sending {total.sending_atomic}, confirmed {total.confirmed_atomic}",
             f"  {'payer':<44} {'owed':>12} {'sending':>12} {'confirmed':>12}"]
    lines += [f"  {p.payer:<44} {p.owed_atomic:>12} {p.sending_atomic:>12} "
              f"{p.confirmed_atomic:>12}" for p in payers]
    return lines


def _table(rows: list[dict[str, Any]], title: str) -> str:
    if not rows:
        return f"{title}: none"
    out = [f"{title}:"]
    for r in rows:
        flag = "STUCK " if r["stuck"] and r["state"] in ("claimed", "settling", "pending") else ""
        out.append(f"  {flag}{r['id']}  {r['state']:<8} {r['age']:>6}  {r['network']:<40} "
                   f"{r['skill']:<24} {r['amount_atomic']:>10}  tx={r['transaction'] or '-'}"
                   + (f"  ({r['error'][:80]})" if r["error"] else ""))
    return "\n".join(out)
