"""`paywire pay`: call an x402 URL and pay for it (payments/payer.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
from decimal import Decimal, InvalidOperation
from typing import Any

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

COMMAND = "paywire pay"
DEPOSIT_VARIABLE = "PAYWIRE_PAY_DEPOSIT"  # --deposit's variable (read here: PayerSettings lacks it)


def register(commands: Commands) -> None:
    payp = commands.add_parser(
        "pay", help="call an x402 URL and pay for it",
        description="\n".join(textwrap.wrap(
            "Call a URL of any x402 server; if it answers 402, choose a payment option the key can "
            "pay, check the price against --max, sign the payment and call again; print the answer "
            "and the settlement receipt. A payment the server is still settling is sent again, "
            "never signed twice. On EVM it pays with `upto` when offered (charged what the call "
            "used, once the payer approved Permit2: --approve-permit2), else `exact`; with "
            "--deposit, through a channel when offered (a deposit once, then a voucher per call, "
            "charged what it used; --refund gets the rest back). Exit code 0 "
            "on a 2xx answer, 1 on another, 2 when it refused to "
            "pay (a bad option, no usable key, a price above --max).", width=100)),
        epilog=payer_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    payp.add_argument("url", help="the URL to call (a paywire route, /a2a, or any x402 server's)")
    payp.add_argument("--data", "-d", help="request body, sent as application/json (default: none)")
    payp.add_argument("--method", "-X", default="POST", help="HTTP method (default: %(default)s)")
    payp.add_argument("--header", "-H", action="append", metavar="'NAME: VALUE'",
                      help="an extra request header; repeatable (default: none)")
    payp.add_argument("--network", help="evm, solana, or a network id such as eip155:84532 "
                      "(default: the first option offered that the key can pay)")
    payp.add_argument("--max", default="0.10", metavar="USD",
                      help="most USD to pay without asking (default: %(default)s)")
    payp.add_argument("--yes", "-y", action="store_true", help="pay above --max without asking")
    add_payment_options(payp)
    payp.add_argument("--approve-permit2", action="store_true",
                      help="if the payer has not approved Permit2 for the quote's USDC (needed by "
                      "upto), send that approval first: one transaction, its gas paid with the "
                      "payer's ETH (on a devnet: the faucet's eth_wei)")
    payp.add_argument("--deposit", metavar="USD",
                      help="pay through an x402 batch-settlement channel when the server offers one "
                      "(EVM, --scheme auto): the most the channel may hold unspent, deposits less "
                      f"charges; a deposit that does not fit is never signed (default: "
                      f"{DEPOSIT_VARIABLE}, else no channel)")
    payp.add_argument("--refund", action="store_true",
                      help="instead of a call: ask the server at URL (any paid route) to refund the "
                      "payer's channel, and print what came back and its transaction")
    payp.add_argument("--json", action="store_true",
                      help="print one JSON document (status, result, receipt, paid_usd)")
    payp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from payments.client_limits import ClientLimits
    from payments.payer import ChannelOptions, PayError, pay, refund

    try:
        max_usd = Decimal(args.max.removeprefix("$"))
    except InvalidOperation:
        raise refuse(COMMAND, f"--max must be a USD amount such as 0.10, got {args.max!r}") from None
    limits = ClientLimits(max_validity_seconds=checked_validity(args, COMMAND))
    try:
        payer = PayerSettings.from_env()
    except ConfigError as exc:
        return config_error(exc, COMMAND)
    deposit = _deposit_cap(args)
    directory = payer.data_dir / "channels"
    try:
        keys, solana_rpc = payer_keys(payer, args.solana_rpc, args.url)
        if args.refund:
            _print_refund(asyncio.run(refund(args.url, keys=keys, directory=directory,
                                             evm_rpc_url=evm_rpc(args, args.url))), as_json=args.json)
            return 0
        data = args.data.encode() if args.data is not None else None
        result = asyncio.run(pay(
            args.url, keys=keys, method=args.method, data=data, headers=_headers(args.header),
            network=args.network, max_usd=max_usd, confirm=lambda q: _confirm(args, q),
            solana_rpc_url=solana_rpc, limits=limits, scheme=args.scheme,
            evm_rpc_url=evm_rpc(args, args.url), approve=args.approve_permit2,
            channels=ChannelOptions(deposit, directory) if deposit is not None else None,
            notice=lambda text: print(f"{COMMAND}: note: {text}", file=sys.stderr, flush=True)))
    except PayError as exc:
        raise stop_on(exc, COMMAND) from None
    _print(result, as_json=args.json)
    return 0 if 200 <= result.status < 300 else 1


def _deposit_cap(args: argparse.Namespace) -> Decimal | None:
    """--deposit, else PAYWIRE_PAY_DEPOSIT: a USD cap, or None (no channel)."""
    from payments.spend_caps import CapError, parse_cap

    given, name = args.deposit, "--deposit"
    if given is None:
        given, name = os.environ.get(DEPOSIT_VARIABLE, "").strip() or None, DEPOSIT_VARIABLE
    if given is None:
        return None
    try:
        return parse_cap(given)
    except CapError as exc:
        raise refuse(COMMAND, f"configuration error: {name} {exc}", CONFIG_ERROR) from None


def _headers(given: list[str] | None) -> dict[str, str]:
    from payments.payer import PayError

    headers = {}
    for h in given or []:
        name, sep, value = h.partition(":")
        if not sep:
            raise PayError(f"-H expects 'Name: value', got {h!r}")
        headers[name.strip()] = value.strip()
    return headers


def _confirm(args: argparse.Namespace, question: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _print(result: Any, *, as_json: bool) -> None:
    from payments.money import usd_text

    body_text = result.body.decode("utf-8", errors="replace")
    receipt = result.receipt
    if as_json:
        try:
            body: object = json.loads(body_text)
        except ValueError:
            body = body_text
        print(json.dumps({
            "status": result.status,
            "result": body,
            "receipt": receipt.model_dump(by_alias=True, exclude_none=True) if receipt else None,
            "paid_usd": usd_text(result.paid_usd) if result.paid_usd is not None else None,
            "scheme": result.scheme,
            "charged_usd": usd_text(result.charged_usd) if result.charged_usd is not None else None,
            **({"deposit_usd": usd_text(result.deposit_usd) if result.deposit_usd is not None else None,
                "channel": result.channel} if result.scheme == "batch-settlement" else {}),
        }, indent=2))
        return
    print(f"HTTP {result.status}")
    print(body_text)
    if receipt is None:
        return
    channel = result.scheme == "batch-settlement"
    print("receipt:")
    print(f"  success      {receipt.success}")
    no_tx = "none (a voucher: nothing on chain)" if channel else ""
    print(f"  transaction  {receipt.transaction or no_tx}")
    print(f"  network      {receipt.network}")
    print(f"  payer        {receipt.payer}")
    print(f"  scheme       {result.scheme}")
    charged = (receipt.extra or {}).get("chargedAmount") if channel else None
    print(f"  amount       {(charged if channel else receipt.amount) or '?'} atomic units{_charged(result)}")
    if result.deposit_usd is not None:
        print(f"  deposit      {receipt.amount} atomic units ({_usd(result.deposit_usd)}), "
              f"transaction {receipt.transaction}")
    if result.channel:
        state = result.channel
        print(f"  channel      {state.get('channelId')}: running total "
              f"{state.get('chargedCumulativeAmount')} of {state.get('balance')} deposited")
    if receipt.error_reason:
        print(f"  error        {receipt.error_reason}")


def _usd(amount: Decimal) -> str:
    from payments.money import display_usd

    return display_usd(amount)


def _charged(result: Any) -> str:
    """What the amount was in USD: with `upto` or a channel, what was charged of the most it
    could be."""
    if result.paid_usd is None:
        return ""
    if result.scheme in ("upto", "batch-settlement") and result.charged_usd is not None:
        return f" (charged {_usd(result.charged_usd)} of at most {_usd(result.paid_usd)})"
    return f" ({_usd(result.paid_usd)})"


def _print_refund(done: Any, *, as_json: bool) -> None:
    from payments.money import usd_text

    if as_json:
        print(json.dumps({"refunded_atomic": str(done.amount_atomic),
                          "refunded_usd": usd_text(done.amount_usd) if done.amount_usd is not None else None,
                          "transaction": done.transaction, "network": done.network,
                          "channel": done.channel}, indent=2))
        return
    usd = f" ({_usd(done.amount_usd)})" if done.amount_usd is not None else ""
    print(f"refunded {done.amount_atomic} atomic units{usd} from channel "
          f"{done.channel.get('channelId', '?')} on {done.network}, transaction {done.transaction}")
