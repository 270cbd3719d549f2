"""The `paywire` command: serve the gateway, show its configuration, pay for a call, check a
resource file, upgrade the database schema."""

from __future__ import annotations

import argparse
import sys
import warnings

from agent.cli import config, db, devnet, federation, ledger, mcp, pay, payers, serve, skills
from agent.cli.common import CommandFailed
from agent.version import VERSION

# Each module registers its command (and subcommands); `paywire --help` lists them in this order.
COMMANDS = (serve, config, pay, mcp, devnet, skills, payers, federation, db, ledger)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paywire", description=__doc__,
                                     epilog="`paywire COMMAND --help`: the command's options, their "
                                     "defaults and the environment variables it reads.")
    parser.add_argument("--version", action="version", version=f"paywire {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def _quiet_sdk_warnings() -> None:
    """The x402 SDK builds Solana payments (and settles them) with solana-py's synchronous
    `Client`, which warns on every construction that it is deprecated (a FutureWarning, shown to
    every user, and a DeprecationWarning): the SDK's choice, nothing a user can act on. Only that
    warning, only from the SDK's Solana modules."""
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", message="Client is deprecated", category=category,
                                module=r"x402\.mechanisms\.svm\.")


def main(argv: list[str] | None = None) -> int:
    _quiet_sdk_warnings()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CommandFailed as failed:  # the command said why, in one line
        return failed.code


if __name__ == "__main__":
    sys.exit(main())
