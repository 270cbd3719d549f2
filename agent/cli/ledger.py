"""`paywire ledger [revenue | payments]`: what the payment ledger holds (ledger_report.py: payments,
refunds, chain fees, channels), and the accounting figures as a table, CSV or JSON
(accounting_report.py). Reads only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.common import CONFIG_ERROR, Commands, refuse
from agent.cli.database import DB_VARIABLES, database_command, database_options, db_settings, db_where

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

_DATABASE_HELP = ("the database (default: PAYWIRE_DATABASE_URL, else the SQLite file paywire.db in "
                  "the data folder)")


def register(commands: Commands) -> None:
    ledger = commands.add_parser(
        "ledger", help="the payments: by state, stuck ones, the reconciler; channels; revenue and "
        "exports",
        description="What the payment ledger holds. With no option: payments and amounts by state, "
        "then the unfinished ones (claimed, settling, pending), oldest first, marked STUCK once "
        "their lease ran out and the reconciler has not settled them yet; the Solana refunds, the "
        "chain fees, and the batch-settlement channels (per network and token: by state, deposits, "
        "charges, claims, the unclaimed rest, the escrow left and the next claim; then the --limit "
        "channels with the most unclaimed in JSON, 20 in text). `paywire ledger revenue`: "
        "revenue, upstream cost and margin by skill, network and day; `paywire ledger payments`: "
        "the payments, filtered, as a table, CSV or JSON (`COMMAND --help` for their options). "
        "Reads only.",
        epilog=DB_VARIABLES)
    ledger.add_argument("--state", choices=_payment_states(),
                        help="list the latest payments in this state instead (default: the counts)")
    ledger.add_argument("--events", action="store_true",
                        help="list what the reconciler did (settled or released a payment), newest first")
    ledger.add_argument("--limit", type=int, default=50, metavar="N",
                        help="at most N payments, events or channels (default: %(default)s)")
    ledger.add_argument("--json", action="store_true", help="print JSON instead of text")
    database_options(ledger, _DATABASE_HELP)
    ledger.set_defaults(func=show)
    _export_parsers(ledger)


def _payment_states() -> list[str]:
    from payments.ledger_schema import PaymentState

    return [state.value for state in PaymentState]


def show(args: argparse.Namespace) -> int:
    from agent.cli.ledger_report import report
    from payments.ledger import Ledger
    from payments.schema import ensure_current

    async def shown(engine: AsyncEngine) -> str:
        await ensure_current(engine, create_if_empty=False)
        ledger = Ledger(engine)
        try:
            return await report(ledger, state=args.state, events=args.events,
                                limit=args.limit, as_json=args.json,
                                prices=db_settings(args).fee_prices)
        finally:
            ledger.close()

    settings, text = database_command("paywire ledger", args, shown, create=False)
    print(text if text is not None else f"no ledger yet: {db_where(settings)}")
    return 0


def _export_parsers(ledger: argparse.ArgumentParser) -> None:
    """`paywire ledger revenue` and `paywire ledger payments` (agent/cli/accounting_report.py)."""
    from agent.cli.accounting_report import FORMATS
    from payments.accounting import GROUPINGS, MAX_PAGE

    exports = ledger.add_subparsers(dest="ledger_command", metavar="{revenue,payments}")
    common = argparse.ArgumentParser(add_help=False)
    when = common.add_argument_group("period (UTC; a day starts at 00:00 UTC; default: all time)")
    when.add_argument("--month", metavar="YYYY-MM",
                      help="one calendar month, e.g. 2026-11 (the month's export); not with --since/--until")
    when.add_argument("--since", metavar="DATE",
                      help="from this date or time, included: 2026-11-01 or 2026-11-01T12:00:00Z "
                      "(default: the first payment)")
    when.add_argument("--until", metavar="DATE",
                      help="up to this date or time, excluded (default: now)")
    common.add_argument("--format", choices=FORMATS, default="table",
                        help="table (for reading), csv (header row; amounts as exact decimal text) "
                        "or json (amounts as exact decimal strings, atomic amounts as integers) "
                        "(default: %(default)s)")
    common.add_argument("--output", "-o", metavar="FILE",
                        help="write to FILE instead of standard output (replaced once complete)")
    database_options(common, _DATABASE_HELP, suppress=True)
    money = ("Revenue is what settled payments paid (USDC, exact); upstream cost what their calls "
             "cost the providers; unbilled cost what calls that failed (nothing charged) still cost "
             "upstream; margin = revenue - upstream cost - unbilled cost.")
    revenue = exports.add_parser(
        "revenue", parents=[common], epilog=DB_VARIABLES,
        help="revenue, upstream cost and margin by skill, network and day",
        description="Revenue, upstream cost and margin of the payments created in a period, in "
        f"total or grouped. {money} A payment counts on the UTC day it was created (claimed; it "
        "settles within the call). Example: paywire ledger revenue --month 2026-11 --by skill "
        "--format csv -o revenue-2026-11.csv")
    revenue.add_argument("--by", metavar="GROUPS",
                         help=f"group by any of {','.join(GROUPINGS)}, comma-separated, e.g. "
                         "skill,day (default: one line, the total); grouped CSV ends with a "
                         "(total) row")
    revenue.set_defaults(func=revenue_report)
    payments = exports.add_parser(
        "payments", parents=[common], epilog=DB_VARIABLES,
        help="the payments, filtered: a table, CSV or JSON",
        description="The payments created in a period that match every filter given: the latest "
        "--limit of them, newest first, or with --all every one, oldest first, streamed (a month "
        "of any size). Example: paywire ledger payments --month 2026-11 --state settled --all "
        "--format csv -o payments-2026-11.csv")
    payments.add_argument("--state", dest="filter_state", choices=_payment_states(),
                          help="only payments in this state (default: any)")
    payments.add_argument("--skill", metavar="ID", help="only this skill's payments (default: any)")
    payments.add_argument("--network", metavar="CAIP2",
                          help="only this network's, e.g. eip155:8453 (default: any)")
    payments.add_argument("--payer", metavar="ADDRESS",
                          help="only this payer's (an EVM address in any case; default: any)")
    payments.add_argument("--tx", metavar="HASH", help="only the payment settled by this transaction")
    payments.add_argument("--limit", dest="rows", type=int, default=50, metavar="N",
                          help=f"the latest N payments, 1 to {MAX_PAGE} (default: %(default)s)")
    payments.add_argument("--all", action="store_true",
                          help="every matching payment, oldest first, instead of the latest --limit")
    payments.set_defaults(func=payments_report)


def revenue_report(args: argparse.Namespace) -> int:
    from agent.cli.accounting_report import write_revenue
    from payments.accounting import AccountingInputError, parse_by

    command = "paywire ledger revenue"
    period, _ = _period_and_filters(args, command)
    try:
        by = parse_by(args.by)
    except AccountingInputError as exc:
        raise refuse(command, f"--{exc.field}: {exc.message}") from None
    return _export(args, command, lambda engine, out: write_revenue(
        engine, out, by=by, period=period, fmt=args.format, prices=db_settings(args).fee_prices))


def payments_report(args: argparse.Namespace) -> int:
    from agent.cli.accounting_report import write_payments
    from payments.accounting import MAX_PAGE

    command = "paywire ledger payments"
    _, filters = _period_and_filters(args, command)
    if not 1 <= args.rows <= MAX_PAGE:
        raise refuse(command, f"--limit: a whole number from 1 to {MAX_PAGE} (--all for every "
                     f"payment), got {args.rows}", CONFIG_ERROR)
    return _export(args, command, lambda engine, out: write_payments(
        engine, out, filters=filters, limit=args.rows, every=args.all, fmt=args.format))


def _period_and_filters(args: argparse.Namespace, command: str) -> tuple[Any, Any]:
    from payments.accounting import AccountingInputError, PaymentFilter, Period

    try:
        period = Period.of(since=args.since, until=args.until, month=args.month)
        filters = PaymentFilter(
            state=getattr(args, "filter_state", None), skill=getattr(args, "skill", None),
            network=getattr(args, "network", None), payer=getattr(args, "payer", None),
            tx=getattr(args, "tx", None), period=period)
    except AccountingInputError as exc:
        raise refuse(command, f"--{exc.field}: {exc.message}") from None
    return period, filters


class _OutputFailed(Exception):
    """--output could not be opened or written (told apart from the database's OSErrors)."""


class _OutputFile:
    """The --output file: a failed write is an _OutputFailed."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, text: str) -> int:
        try:
            return int(self._file.write(text))
        except OSError as exc:
            raise _OutputFailed(exc) from None

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)


def _export(args: argparse.Namespace, command: str,
            write: Callable[[AsyncEngine, Any], Awaitable[Any]]) -> int:
    """Run `write(engine, out)` on the ledger's database, `out` stdout or --output FILE (written
    next to it, then renamed into place: an interrupted export leaves no half file)."""
    from payments.schema import ensure_current

    output = Path(args.output) if args.output else None
    partial = output.with_name(f".{output.name}.partial") if output else None
    if output is not None and output.exists() and not output.is_file():
        partial = None  # a device or pipe (/dev/stdout): written as it is, never replaced

    async def run(engine: AsyncEngine) -> Any:
        await ensure_current(engine, create_if_empty=False)
        if output is None:
            return await write(engine, sys.stdout)
        try:
            out = (partial or output).open("w", encoding="utf-8", newline="")
        except OSError as exc:
            raise _OutputFailed(exc) from None
        try:
            return await write(engine, _OutputFile(out))
        finally:
            try:
                out.close()  # flushes: a full disk may only show here
            except OSError as exc:
                raise _OutputFailed(exc) from None  # noqa: B012 (the file's failure is the news)

    finished = False
    try:
        settings, done = database_command(command, args, run, create=False)
        finished = True
    except _OutputFailed as exc:  # --output cannot be written
        cause = exc.args[0]
        raise refuse(command, f"--output {output}: {getattr(cause, 'strerror', None) or cause}",
                     1) from None
    finally:
        if partial is not None and not finished:
            partial.unlink(missing_ok=True)
    if done is None:
        raise refuse(command, f"no ledger yet: {db_where(settings)}", 1)
    if output is not None:
        if partial is not None:
            partial.replace(output)
        print(f"{command}: wrote {output}", file=sys.stderr)
    return 0
