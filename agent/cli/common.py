"""What every command shares: the exit code of a configuration problem and its one line, the
`CommandFailed` a command raises once it has said why, and a setting's default for help texts."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent.settings import ConfigError, Settings

CONFIG_ERROR = 2  # the exit code of every configuration problem

# `add_subparsers()`'s return type is private in argparse; each command module registers on it.
Commands = Any


class CommandFailed(Exception):
    """The command printed why it stops; `main` exits with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def config_error(exc: ConfigError, command: str = "paywire") -> int:
    """One line naming every problem, never a traceback."""
    print(f"{command}: configuration error: {' '.join(str(exc).split())}", file=sys.stderr)
    return CONFIG_ERROR


def refuse(command: str, message: str, code: int = CONFIG_ERROR) -> CommandFailed:
    """`command: message` on stderr; the CommandFailed to raise."""
    print(f"{command}: {message}", file=sys.stderr)
    return CommandFailed(code)


def setting_default(variable: str) -> str:
    """A setting's default as text (`paywire serve --help` lists them all)."""
    return next(default for name, default, _ in Settings.reference() if name == variable)


def serve_settings(args: argparse.Namespace) -> Settings:
    """The gateway's settings, `--host` and `--port` in place of their variables."""
    import os

    env = dict(os.environ)
    if getattr(args, "host", None):
        env["PAYWIRE_HOST"] = args.host
    if getattr(args, "port", None):
        env["PAYWIRE_PORT"] = str(args.port)
    return Settings.from_env(env)
