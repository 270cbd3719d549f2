"""`paywire payers deny | allow | list`: the payer deny list every gateway sharing the database
applies."""

from __future__ import annotations

import argparse
from typing import Any

from agent.cli.common import Commands
from agent.cli.controls import CONTROLS_VARIABLES, controls_command, controls_options


def register(commands: Commands) -> None:
    payers = commands.add_parser(
        "payers", help="the payer deny list: deny, allow, list",
        description="Payers whose payments every gateway sharing the database refuses (403 "
        "payer_denied, before any facilitator is asked, nothing charged).", epilog=CONTROLS_VARIABLES)
    payers_sub = payers.add_subparsers(dest="payers_command", required=True)
    deny = payers_sub.add_parser(
        "deny", help="refuse a payer's payments",
        description="Add a payer to the deny list (an EVM address, any case; a base58 Solana "
        "address).", epilog=CONTROLS_VARIABLES)
    deny.add_argument("address", metavar="ADDRESS", help="the payer's address")
    deny.add_argument("--reason", help="why (kept for operators; at most 500 characters; default: none)")
    allow = payers_sub.add_parser(
        "allow", help="take a payer off the deny list",
        description="Take a payer off the deny list.", epilog=CONTROLS_VARIABLES)
    allow.add_argument("address", metavar="ADDRESS", help="the payer's address")
    listing = payers_sub.add_parser(
        "list", help="list the denied payers",
        description="List the denied payers: address, since when, why (tab-separated).",
        epilog=CONTROLS_VARIABLES)
    for parser in (deny, allow, listing):
        controls_options(parser)
        parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    async def work(controls: Any) -> str:
        if args.payers_command == "deny":
            denied = await controls.deny_payer(args.address, reason=args.reason)
            return f"{denied.payer}: denied (its payments are refused with 403 before any facilitator)"
        if args.payers_command == "allow":
            from payments.controls import normalize_payer

            payer = normalize_payer(args.address)
            was = await controls.allow_payer(payer)
            return f"{payer}: allowed" + ("" if was else " (it was not denied)")
        found = await controls.denied_payers()
        return "\n".join(f"{p.payer}\t{p.created_at:%Y-%m-%d %H:%M:%S}\t{p.reason or ''}"
                         for p in found) or "no payer is denied"

    return controls_command(args, f"paywire payers {args.payers_command}", work)
