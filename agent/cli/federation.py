"""`paywire federation add | list | remove | refresh | report`: the sources every gateway sharing
the database imports other x402 sellers' resources from (federation/store.py), a refresh asked
of the running gateways, and what upstream sellers were paid, earned on and lost."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from agent.cli.common import CONFIG_ERROR, Commands, refuse
from agent.cli.database import database_command, database_options

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from agent.settings import Settings
    from federation.store import FederationStore

VARIABLES = (
    "variables read: PAYWIRE_DATABASE_URL (the database the gateways share; a SQLAlchemy URL with "
    "an async driver; default: the SQLite file paywire.db in PAYWIRE_DATA_DIR), PAYWIRE_DATA_DIR "
    "(default .paywire), PAYWIRE_FEDERATION_MARGIN_PERCENT and PAYWIRE_FEDERATION_MARGIN_USD (the "
    "margin `add` uses unless given). Running gateways import a source's resources at their next "
    "refresh (PAYWIRE_FEDERATION_REFRESH_SECONDS; `paywire federation refresh`: within "
    "PAYWIRE_CONTROLS_REFRESH_SECONDS). Sources named in PAYWIRE_FEDERATE are stored by each "
    "gateway at start. A configuration problem or a wrong option is one line on stderr and exit "
    f"code {CONFIG_ERROR}; a database that cannot be reached, one line and exit code 1.")
_DATABASE_HELP = ("the database the gateways share (default: PAYWIRE_DATABASE_URL, else the SQLite "
                  "file paywire.db in the data folder)")
MAX_MARGIN_PERCENT = Decimal(1000)
MAX_MARGIN_USD = Decimal(1000)
MAX_UPSTREAM_USD = Decimal(1_000_000)


def register(commands: Commands) -> None:
    federation = commands.add_parser(
        "federation", help="resell other x402 sellers: sources (add, list, remove), refresh, report",
        description="The sources every gateway sharing the database imports resources from (a "
        "discovery catalogue: a facilitator's /discovery/resources or a seller's "
        "/.well-known/x402; or one seller's resource, probed unpaid), sold at the upstream's price "
        "plus a margin; each call pays its upstream seller from PAYWIRE_FEDERATION_PAYER_KEY, "
        "within the caps.", epilog=VARIABLES)
    sub = federation.add_subparsers(dest="federation_command", required=True)
    add = sub.add_parser(
        "add", help="add a source (or replace the one with its URL)",
        description="Add a source; the same URL again replaces its filters and margin. Filters "
        "given several times admit an offer matching any of them; none admits every offer.",
        epilog=VARIABLES)
    add.add_argument("url", metavar="URL", help="the catalogue's URL (http:// or https://), or "
                     "with --seller one resource's URL")
    add.add_argument("--seller", action="store_true",
                     help="URL is one seller's resource, probed unpaid for its 402 (default: a "
                     "catalogue)")
    add.add_argument("--category", action="append", metavar="C",
                     help="import only offers in this category (repeatable; default: any)")
    add.add_argument("--keyword", action="append", metavar="K",
                     help="import only offers whose name, description or URL holds this word "
                     "(repeatable; default: any)")
    add.add_argument("--network", action="append", metavar="N",
                     help="import only offers payable on this network, e.g. base or eip155:8453 "
                     "(repeatable; default: any paywire can pay on)")
    add.add_argument("--max-upstream-usd", metavar="X",
                     help="import only offers whose upstream price is at most X USD (default: no "
                     "limit)")
    add.add_argument("--allow-seller", action="append", metavar="S",
                     help="import only from this seller: a host name or an origin "
                     "(https://host:port) (repeatable; default: every seller)")
    add.add_argument("--deny-seller", action="append", metavar="S",
                     help="never import from this seller (repeatable; default: none)")
    add.add_argument("--margin-percent", metavar="P",
                     help="the percent added to the upstream's price, 0 to 1000 (default: "
                     "PAYWIRE_FEDERATION_MARGIN_PERCENT, else 10)")
    add.add_argument("--margin-usd", metavar="U",
                     help="a fixed USD amount added to each price, 0 to 1000 (default: "
                     "PAYWIRE_FEDERATION_MARGIN_USD, else 0)")
    listing = sub.add_parser(
        "list", help="list the sources, their last refresh and what they import",
        description="The sources: id, kind, origin (env: PAYWIRE_FEDERATE; cli), margin, the "
        "resources imported now and the last refresh (when, whether it worked, what it said).",
        epilog=VARIABLES)
    listing.add_argument("--resources", action="store_true",
                         help="list the imported resources instead: id, source, upstream price "
                         "and sale price (USD), seller URL")
    remove = sub.add_parser(
        "remove", help="remove a source and the resources imported from it",
        description="Remove a source; its resources stop being sold on every gateway within "
        "PAYWIRE_CONTROLS_REFRESH_SECONDS. A source named in PAYWIRE_FEDERATE comes back when a "
        "gateway starts with it.", epilog=VARIABLES)
    remove.add_argument("source", metavar="SOURCE_ID|URL",
                        help="the source's id (`paywire federation list`) or URL")
    refresh = sub.add_parser(
        "refresh", help="have the running gateways refresh every source now",
        description="Ends the refresh turn (paywire_turns 'federation-refresh'), so the next "
        "gateway to poll it (within PAYWIRE_CONTROLS_REFRESH_SECONDS) fetches every source again "
        "instead of waiting for PAYWIRE_FEDERATION_REFRESH_SECONDS to pass.", epilog=VARIABLES)
    report = sub.add_parser(
        "report", help="per upstream seller: paid out, earned, lost",
        description="Per upstream seller, since the beginning (USD, exact): what it was paid for "
        "the calls it answered, what those calls earned (what their callers were charged less "
        "what they cost), and what was lost (paid with no answer kept).", epilog=VARIABLES)
    report.add_argument("--json", action="store_true", help="print JSON instead of text")
    for parser in (add, listing, remove, refresh, report):
        database_options(parser, _DATABASE_HELP)
        parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = f"paywire federation {args.federation_command}"
    work = {"add": _add, "list": _list, "remove": _remove, "refresh": _refresh,
            "report": _report}[args.federation_command](args, name)
    return _on_store(args, name, work)


Work = Callable[["FederationStore", "Settings"], Awaitable[str]]


def _on_store(args: argparse.Namespace, command: str, work: Work) -> int:
    """`work(store, settings)` on the configured database (schema current); prints its text."""
    from federation.store import FederationStore
    from payments.ledger import Ledger
    from payments.schema import ensure_current

    found: list[Settings] = []

    async def on(engine: AsyncEngine) -> str:
        await ensure_current(engine)
        ledger = Ledger(engine)
        try:
            return await work(FederationStore(ledger), found[0])
        finally:
            ledger.close()

    _, said = database_command(command, args, on, check=found.append)
    print(said)
    return 0


# -- add -------------------------------------------------------------------------------------

def _add(args: argparse.Namespace, command: str) -> Work:
    from federation.config import filters_of, url_problem
    from federation.model import Margin, Source, source_id_for

    url = args.url.strip()
    problem = url_problem(url)
    if problem:
        raise refuse(command, f"URL: {problem}")
    cap = _amount(command, "--max-upstream-usd", args.max_upstream_usd, MAX_UPSTREAM_USD,
                  positive=True)
    percent = _amount(command, "--margin-percent", args.margin_percent, MAX_MARGIN_PERCENT)
    fixed = _amount(command, "--margin-usd", args.margin_usd, MAX_MARGIN_USD)
    try:  # the rules PAYWIRE_FEDERATION_* follow (federation/config.py); only a network can fail
        filters = filters_of(categories=_joined(args.category), keywords=_joined(args.keyword),
                             networks=_joined(args.network), max_upstream_usd=cap,
                             allow_sellers=_joined(args.allow_seller),
                             deny_sellers=_joined(args.deny_seller))
    except ValueError as exc:
        raise refuse(command, f"--network: {exc}") from None

    async def work(store: FederationStore, settings: Settings) -> str:
        margin = Margin(settings.federation_margin_percent if percent is None else percent,
                        settings.federation_margin_usd if fixed is None else fixed)
        source = Source(source_id_for(url), url, "seller" if args.seller else "catalogue",
                        filters, margin, origin="cli")
        known = {s.id for s in await store.sources()}
        await store.put_source(source)
        return (f"{source.id}: {'replaced' if source.id in known else 'added'} ({source.kind} "
                f"{url}; margin {_plain(margin.percent)}% + {_plain(margin.fixed_usd)} USD"
                f"{_filters_text(filters)}); running gateways import it at their next refresh "
                "(`paywire federation refresh`: now)")

    return work


def _joined(values: list[str] | None) -> str | None:
    return ",".join(values) if values else None


def _amount(command: str, flag: str, text: str | None, most: Decimal, *,
            positive: bool = False) -> Decimal | None:
    """An exact decimal option: 0 (or above 0) to `most`; None when not given."""
    if text is None:
        return None
    low = "above 0" if positive else "from 0"
    rule = f"a decimal number {low} to {_plain(most)}, such as 0.5"
    try:
        value = Decimal(text.strip().removeprefix("$"))
    except InvalidOperation:
        raise refuse(command, f"{flag}: {rule}; got {text[:40]!r}") from None
    if not value.is_finite() or value < 0 or (positive and value == 0) or value > most:
        raise refuse(command, f"{flag}: {rule}; got {text[:40]!r}")
    return value


def _plain(amount: Decimal) -> str:
    from payments.accounting import decimal_text

    return decimal_text(amount)


def _filters_text(filters: Any) -> str:
    parts = [f"{name} {', '.join(sorted(values))}" for name, values in (
        ("categories", filters.categories), ("keywords", filters.keywords),
        ("networks", filters.networks), ("only sellers", filters.allow_sellers),
        ("never sellers", filters.deny_sellers)) if values]
    if filters.max_upstream_usd is not None:
        parts.append(f"upstream at most {_plain(filters.max_upstream_usd)} USD")
    return "; " + "; ".join(parts) if parts else ""


# -- list, remove, refresh, report ------------------------------------------------------------

def _list(args: argparse.Namespace, command: str) -> Work:
    async def work(store: FederationStore, settings: Settings) -> str:
        if args.resources:
            found = await store.resources()
            if not found:
                return "no resource is imported"
            lines = [f"{'resource':<72} {'source':<32} {'upstream USD':>14} {'price USD':>14}  url"]
            lines += [f"{r.resource_id:<72} {r.source_id:<32} "
                      f"{_plain(r.offer.upstream_usd):>14} {_plain(r.price_usd):>14}  "
                      f"{r.offer.method} {r.offer.url}" for r in found]
            return "\n".join(lines)
        statuses = await store.source_statuses()
        if not statuses:
            return "no source: `paywire federation add URL` adds one (or PAYWIRE_FEDERATE)"
        lines = []
        for s in statuses:
            src = s.source
            lines.append(f"{src.id}  {src.kind}  {src.url}  (origin {src.origin}; margin "
                         f"{_plain(src.margin.percent)}% + {_plain(src.margin.fixed_usd)} USD"
                         f"{_filters_text(src.filters)})")
            lines.append(f"  imported: {s.resources} resources; last refresh: {_refresh_text(s)}")
        return "\n".join(lines)

    return work


def _refresh_text(s: Any) -> str:
    if s.last_refresh_at is None:
        return "never"
    when = f"{_when(s.last_refresh_at)} UTC"
    if not s.last_refresh_ok:
        return f"{when}, FAILED: {s.last_refresh_detail or 'no detail'}"
    detail = f" ({s.last_refresh_detail})" if s.last_refresh_detail else ""
    return f"{when}, ok, {s.last_count} offers imported{detail}"


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _remove(args: argparse.Namespace, command: str) -> Work:
    from federation.model import source_id_for

    given = args.source.strip()

    async def work(store: FederationStore, settings: Settings) -> str:
        match = next((s for s in await store.sources()
                      if given in (s.id, s.url) or s.id == source_id_for(given)), None)
        if match is None or not await store.remove_source(match.id):
            raise refuse(command, f"SOURCE_ID|URL: no source {given[:200]!r}; `paywire "
                         "federation list` shows them")
        again = (" (it is named in PAYWIRE_FEDERATE: a gateway starting with it stores it again)"
                 if match.origin == "env" else "")
        return (f"{match.id}: removed ({match.url}) with its resources; running gateways stop "
                f"selling them within PAYWIRE_CONTROLS_REFRESH_SECONDS{again}")

    return work


def _refresh(args: argparse.Namespace, command: str) -> Work:
    async def work(store: FederationStore, settings: Settings) -> str:
        if await store.request_refresh():
            return ("refresh requested: the next running gateway to poll the refresh turn "
                    f"fetches every source again (within {settings.controls_refresh_seconds:g} s, "
                    "PAYWIRE_CONTROLS_REFRESH_SECONDS)")
        return ("no gateway has refreshed yet: the first one to start (or one running) refreshes "
                "every source at once")

    return work


def _report(args: argparse.Namespace, command: str) -> Work:
    from agent.cli.ledger_report import seller_json, seller_lines

    async def work(store: FederationStore, settings: Settings) -> str:
        sellers = await store.seller_totals()
        if args.json:
            return json.dumps({"by_seller": [seller_json(t) for t in sellers]}, indent=2)
        if not sellers:
            return "no upstream seller was paid yet"
        return "\n".join(seller_lines(sellers))

    return work
