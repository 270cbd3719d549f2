"""What the paying commands (`paywire pay`, `paywire mcp`) share: the variables they read, the
payer's keys, its Solana and EVM nodes, the scheme it pays with and the longest validity it signs."""

from __future__ import annotations

import argparse
import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.cli.common import CommandFailed, refuse
from agent.settings import PayerSettings
from payments.client_limits import DEFAULT_LIMITS

LONGEST_VALIDITY = 86_400  # seconds: --max-validity may allow up to a day, never more


def payer_help(command: str = "pay") -> str:
    """The variables `paywire COMMAND` reads (pay, mcp), their defaults and meanings: each
    PayerSettings field's meaning starts with the commands that read it."""
    lines = ["variables read (an option wins over its variable):"]
    for variable, default, meaning in PayerSettings.reference():
        readers, _, meaning = meaning.partition(": ")
        if f"`paywire {command}`" not in readers:
            continue
        text = f"{variable} (default {default}): {meaning}" if default != "-" else f"{variable}: {meaning}"
        lines += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def add_payment_options(parser: argparse.ArgumentParser) -> None:
    """--solana-rpc, --evm-rpc, --scheme and --max-validity: how a payment is built."""
    parser.add_argument("--solana-rpc", metavar="URL",
                        help="the Solana node a Solana payment is built with (default: "
                        "PAYWIRE_SOLANA_RPC_URL, else the devnet's when the server is a paywire devnet)")
    parser.add_argument("--evm-rpc", metavar="URL",
                        help="the EVM node the payer's Permit2 allowance is read from, for `upto` "
                        "(default: the devnet's when the server is a paywire devnet, else the "
                        "network's public node: Base, Base Sepolia)")
    parser.add_argument("--scheme", choices=("auto", "upto", "exact"), default="auto",
                        help="x402 scheme: upto pays what the call used (EVM, the payer's Permit2 "
                        "approval needed), exact pays the quote; auto: upto when offered and "
                        "payable, else exact (default: %(default)s)")
    parser.add_argument(
        "--max-validity", type=int, default=DEFAULT_LIMITS.max_validity_seconds, metavar="SECONDS",
        help="the longest a signed payment stays valid: a quote asking for longer gets a payment "
        "valid this long, which a server that needs longer may refuse (nothing moves then); at "
        f"most {LONGEST_VALIDITY} (default: %(default)s)")


def checked_validity(args: argparse.Namespace, command: str) -> int:
    """--max-validity, once within 1 s to a day; else one line and CommandFailed."""
    if not 1 <= args.max_validity <= LONGEST_VALIDITY:
        raise refuse(command, f"--max-validity must be from 1 to {LONGEST_VALIDITY} seconds, got "
                     f"{args.max_validity}")
    return int(args.max_validity)


def payer_keys(payer: PayerSettings, solana_rpc: str | None, url: str) -> tuple[Any, str | None]:
    """The payer's keys (PAYWIRE_PAYER_KEY, else the devnet demo payer's) and the Solana node to
    build payments with (the option, PAYWIRE_SOLANA_RPC_URL, else a devnet paywire's at `url`).
    PayError says what is missing."""
    from payments.payer import PayerKeys, PayError

    secret = payer.payer_key.get_secret_value() if payer.payer_key else ""
    solana_rpc = solana_rpc or payer.solana_rpc_url or None
    if secret:
        return PayerKeys.from_secret(secret), solana_rpc
    demo = _demo_keys(payer.data_dir)
    if demo is None:
        raise PayError("no payer key: set PAYWIRE_PAYER_KEY, or run `paywire serve` "
                       "(devnet) from this folder first to create the demo payer")
    keys = PayerKeys(evm_key=demo.evm_payer, solana_key=demo.sol_payer)  # type: ignore[attr-defined]
    return keys, solana_rpc or asyncio.run(devnet_rpc(url, "solana"))


def evm_rpc(args: argparse.Namespace, url: str) -> str | None:
    """The EVM node to read the chain with: --evm-rpc, else a devnet paywire's at `url` (asked
    only when `upto` may be paid); None: the network's public node (payments/payer.evm_node)."""
    if args.evm_rpc or args.scheme == "exact":
        return args.evm_rpc or None
    return asyncio.run(devnet_rpc(url, "evm"))


def _demo_keys(data_dir: Path) -> object | None:
    from payments.devnet.keys import KEYS_FILE, DevnetKeys

    path = data_dir / KEYS_FILE
    if not path.exists():
        return None
    return DevnetKeys(**json.loads(path.read_text()))


async def devnet_rpc(url: str, family: str) -> str | None:
    """A devnet paywire announces its nodes ("evm", "solana") at /devnet; other servers do not
    (their answer is read within the client's limits, like any other)."""
    import httpx

    from payments.client_limits import NO_COMPRESSION, AnswerTooLarge, read_bounded

    parts = urlsplit(url)
    try:
        async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(5):
            async with http.stream("GET", f"{parts.scheme}://{parts.netloc}/devnet",
                                   headers=NO_COMPRESSION) as answer:
                info = json.loads(await read_bounded(answer, DEFAULT_LIMITS.quote_bytes))
        return str(info["networks"][family]["rpc_url"])
    except (httpx.HTTPError, AnswerTooLarge, TimeoutError, ValueError, KeyError, TypeError):
        return None


def stop_on(exc: Exception, command: str) -> CommandFailed:
    """A PayError as the command's one line and exit code (2: refused to pay; 1: no answer)."""
    return refuse(command, str(exc), getattr(exc, "exit_code", 2))
