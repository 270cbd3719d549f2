"""`paywire mcp`: a local stdio MCP server paying a remote x402 MCP server's tools within spend
caps (agent/mcp/proxy.py); `--spent` prints the spend ledger."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
from decimal import Decimal

from agent.cli.common import CONFIG_ERROR, Commands, config_error, refuse
from agent.cli.paying import (
    add_payment_options,
    checked_validity,
    evm_rpc,
    payer_help,
    payer_keys,
    stop_on,
)
from agent.settings import ConfigError, PayerSettings

COMMAND = "paywire mcp"
DEPOSIT_VARIABLE = "PAYWIRE_MCP_MAX_DEPOSIT"  # --max-deposit's (read here: PayerSettings lacks it)

# The options of `paywire mcp` that stand for a variable (checked as the variable is).
_OPTION_VARIABLES = {"server": "PAYWIRE_MCP_SERVER_URL", "network": "PAYWIRE_MCP_NETWORK",
                     "max_per_call": "PAYWIRE_MCP_MAX_PER_CALL", "max_per_day": "PAYWIRE_MCP_MAX_PER_DAY",
                     "ledger": "PAYWIRE_MCP_LEDGER", "solana_rpc": "PAYWIRE_SOLANA_RPC_URL"}


def register(commands: Commands) -> None:
    mcpp = commands.add_parser(
        "mcp", help="a local stdio MCP server that pays a remote x402 MCP server's tools, within caps",
        description="\n".join(textwrap.wrap(
            "Serve MCP on stdin/stdout for a desktop agent (the command of its MCP config): the "
            "tools of a remote MCP server (streamable HTTP: a paywire's /mcp, or any x402 MCP "
            "server), paid from your key when the remote asks (x402's MCP transport). A payment "
            "over --max-per-call, or past --max-per-day (UTC days; every payment not proven unspent "
            "counts), is refused before anything is signed, and the tool call answers an error "
            "saying which cap and how to raise it. With --max-deposit it pays through an x402 "
            "channel when the remote offers one: a deposit once (escrow, within that cap), then a "
            "voucher per call, charged what it used (--refund gets the rest back). Every payment is "
            "recorded in the spend ledger (--spent prints it). Logs go to stderr, never the key, a "
            "payment or tool arguments.",
            width=100)),
        epilog=payer_help("mcp"), formatter_class=argparse.RawDescriptionHelpFormatter)
    mcpp.add_argument("--server", metavar="URL",
                      help="the remote MCP endpoint, e.g. https://gateway.example/mcp (default: "
                      "PAYWIRE_MCP_SERVER_URL; required unless --spent)")
    mcpp.add_argument("--network", help="pay on this network only: evm, solana, or a network id "
                      "such as eip155:84532 (default: PAYWIRE_MCP_NETWORK, else the first option "
                      "offered that the key can pay)")
    mcpp.add_argument("--max-per-call", metavar="USD",
                      help="the most one tool call may cost (default: PAYWIRE_MCP_MAX_PER_CALL, "
                      f"else {PayerSettings.model_fields['mcp_max_per_call'].default})")
    mcpp.add_argument("--max-per-day", metavar="USD",
                      help="the most signed per UTC day (default: PAYWIRE_MCP_MAX_PER_DAY, else "
                      f"{PayerSettings.model_fields['mcp_max_per_day'].default})")
    mcpp.add_argument("--ledger", metavar="PATH",
                      help="the spend ledger, a SQLite file (default: PAYWIRE_MCP_LEDGER, else "
                      "mcp-spend.db in PAYWIRE_DATA_DIR)")
    mcpp.add_argument("--max-deposit", metavar="USD",
                      help="pay through x402 batch-settlement channels when the remote offers one "
                      "(EVM, --scheme auto): the most all channels may hold in escrow, deposits less "
                      "charges; a deposit past it is never signed (default: "
                      f"{DEPOSIT_VARIABLE}, else no channel)")
    add_payment_options(mcpp)
    mcpp.add_argument("--spent", action="store_true",
                      help="print today's total and the latest payments from the ledger, and exit")
    mcpp.add_argument("--refund", action="store_true",
                      help="refund the channels paid through at --server (what they hold above their "
                      "charges comes back), print what came back, and exit")
    mcpp.add_argument("--limit", type=int, default=20, metavar="N",
                      help="with --spent: at most N payments, newest first (default: %(default)s)")
    mcpp.add_argument("--json", action="store_true", help="with --spent: print one JSON document")
    mcpp.add_argument("--log-level", default="warning", choices=["error", "warning", "info", "debug"],
                      help="log level on stderr (default: %(default)s; info logs each payment)")
    mcpp.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> PayerSettings:
    """PayerSettings with the options of `paywire mcp` in place of their variables (checked alike)."""
    env = dict(os.environ)
    for option, variable in _OPTION_VARIABLES.items():
        value = getattr(args, option, None)
        if value is not None:
            env[variable] = str(value)
    try:
        return PayerSettings.from_env(env)
    except ConfigError as exc:  # name the option the user typed, not only its variable
        given = {variable: option for option, variable in _OPTION_VARIABLES.items()
                 if getattr(args, option, None) is not None}
        problems = []
        for problem in exc.problems:
            variable = problem.split(" ", 1)[0]
            if variable in given:
                problem = f"--{given[variable].replace('_', '-')} ({variable}){problem[len(variable):]}"
            problems.append(problem)
        raise ConfigError.of(problems) from None


def _max_deposit(args: argparse.Namespace) -> Decimal | None:
    """--max-deposit, else PAYWIRE_MCP_MAX_DEPOSIT: a USD cap, or None (no channel)."""
    from payments.spend_caps import CapError, parse_cap

    given, name = args.max_deposit, f"--max-deposit ({DEPOSIT_VARIABLE})"
    if given is None:
        given, name = os.environ.get(DEPOSIT_VARIABLE, "").strip() or None, DEPOSIT_VARIABLE
    if given is None:
        return None
    try:
        return parse_cap(given)
    except CapError as exc:
        raise refuse(COMMAND, f"configuration error: {name} {exc}", CONFIG_ERROR) from None


def run(args: argparse.Namespace) -> int:
    from agent.mcp.proxy import (
        Caps,
        ProxyConfig,
        ProxyError,
        configure_logging,
        refund_channels,
        serve_stdio,
    )
    from payments.client_limits import ClientLimits
    from payments.payer import PayError

    try:
        settings = _settings(args)
    except ConfigError as exc:
        return config_error(exc, COMMAND)
    max_deposit = _max_deposit(args)
    if args.spent:
        return _print_spent(settings, args, max_deposit)
    limits = ClientLimits(max_validity_seconds=checked_validity(args, COMMAND))
    if not settings.mcp_server_url:
        raise refuse(COMMAND, "no server: pass --server URL (the remote MCP endpoint, e.g. "
                     "https://gateway.example/mcp) or set PAYWIRE_MCP_SERVER_URL")
    configure_logging(args.log_level)
    try:
        keys, solana_rpc = payer_keys(settings, None, settings.mcp_server_url)
    except PayError as exc:
        raise stop_on(exc, COMMAND) from None
    config = ProxyConfig(
        server_url=settings.mcp_server_url, keys=keys, network=settings.mcp_network,
        caps=Caps(per_call=settings.mcp_max_per_call, per_day=settings.mcp_max_per_day),
        ledger_path=settings.mcp_ledger_path, solana_rpc_url=solana_rpc, limits=limits,
        scheme=args.scheme, evm_rpc_url=evm_rpc(args, settings.mcp_server_url),
        max_deposit=max_deposit, channel_dir=settings.data_dir / "channels")
    try:
        if args.refund:
            outcomes = asyncio.run(refund_channels(config))
            for done, what in outcomes:
                print(what if done else f"{COMMAND}: {what}", file=sys.stdout if done else sys.stderr)
            return 0 if all(done for done, _ in outcomes) else 1
        asyncio.run(serve_stdio(config))
    except ProxyError as exc:
        raise refuse(COMMAND, str(exc), 1) from None
    except KeyboardInterrupt:
        pass
    return 0


def _print_spent(settings: PayerSettings, args: argparse.Namespace, max_deposit: Decimal | None) -> int:
    """Today's total against the daily cap, the escrow held in channels, then the latest payments
    (exact decimals)."""
    from payments.money import display_usd, usd_text
    from payments.spend_caps import SpendLedger, micros_usd

    if not 1 <= args.limit <= 1000:
        raise refuse(COMMAND, f"--limit must be from 1 to 1000, got {args.limit}", CONFIG_ERROR)
    path = settings.mcp_ledger_path
    if not path.exists():
        raise refuse(COMMAND, f"no spend ledger at {path} yet (nothing paid; --ledger or "
                     "PAYWIRE_MCP_LEDGER names another)", 1)
    ledger = SpendLedger(path)
    day, spent = ledger.spent_today()
    held = ledger.escrow()
    rows = ledger.recent(args.limit)
    if args.json:
        print(json.dumps({"day": day, "spent_usd": usd_text(micros_usd(spent)),
                          "max_per_day_usd": usd_text(settings.mcp_max_per_day),
                          "max_per_call_usd": usd_text(settings.mcp_max_per_call),
                          "escrow_usd": usd_text(micros_usd(held)),
                          "max_deposit_usd": usd_text(max_deposit) if max_deposit is not None else None,
                          "payments": [row.as_json() for row in rows]}, indent=2))
        return 0
    print(f"today (UTC {day}): {display_usd(micros_usd(spent))} counted of "
          f"{display_usd(settings.mcp_max_per_day)} a day; at most "
          f"{display_usd(settings.mcp_max_per_call)} a call; ledger {path}")
    cap = f" of {display_usd(max_deposit)} (--max-deposit)" if max_deposit is not None else ""
    print(f"in channels' escrow (deposits less charges and refunds: yours until charged): "
          f"{display_usd(micros_usd(held))}{cap}")
    print(f"{'time (UTC)':<27}  {'status':<8}  {'USD':>10}  {'network':<41}  tool  (server)  "
          "transaction  (what it was)")
    for row in rows:
        print(f"{row.created_at:<27}  {row.status:<8}  {usd_text(row.usd):>10}  {row.network:<41}  "
              f"{row.tool}  ({row.server})  {row.tx_hash or '-'}{_what(row)}")
    return 0


def _what(row: object) -> str:
    """A row's kind, its channel and its charge, where there is more to say than its amount."""
    from payments.money import usd_text

    kind, channel, charged = (getattr(row, name) for name in ("kind", "channel_id", "charged_usd"))
    charge = f", charged {usd_text(charged)}" if charged is not None else ""
    if kind == "voucher":
        return f"  (a voucher of channel {channel}: its ceiling's rise{charge})"
    if kind in ("deposit", "refund"):
        return f"  (a {kind}: {'into' if kind == 'deposit' else 'from'} channel {channel}, escrow)"
    return f"  (charged {usd_text(charged)})" if charged is not None else ""
