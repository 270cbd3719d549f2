"""`paywire serve`: run the gateway (devnet unless PAYWIRE_NETWORKS names real networks)."""

from __future__ import annotations

import argparse
import socket
import sys
import textwrap

from agent.cli.common import (
    CONFIG_ERROR,
    CommandFailed,
    Commands,
    config_error,
    serve_settings,
    setting_default,
)
from agent.cli.database import DatabaseUnusable, database_error, on_database, schema_problem
from agent.settings import ConfigError, Settings


def register(commands: Commands) -> None:
    serve = commands.add_parser(
        "serve", help="run the gateway (devnet unless configured)",
        description="Run the gateway: devnet unless PAYWIRE_NETWORKS names real "
        "networks. A configuration problem stops it with one line naming every "
        f"variable at fault (exit code {CONFIG_ERROR}).",
        epilog=settings_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", help="address to listen on (default: PAYWIRE_HOST, else "
                       f"{setting_default('PAYWIRE_HOST')})")
    serve.add_argument("--port", type=int, help="port to listen on (default: PAYWIRE_PORT, else "
                       f"{setting_default('PAYWIRE_PORT')})")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="log level (default: %(default)s; info and below log each request)")
    serve.set_defaults(func=run)


def settings_help() -> str:
    """Every setting, its default and meaning, for `paywire serve --help`."""
    lines = ["settings (environment variables; `paywire config` prints the effective values):"]
    for variable, default, meaning in Settings.reference():
        text = f"{variable} (default {default}): {meaning}" if default != "-" else f"{variable}: {meaning}"
        lines += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="      ")
    lines.append("  Resource files declare the variables they read (`env`, `*_env` fields), e.g. "
                 "NANSEN_API_KEY;")
    lines.append("  `paywire config` lists them.")
    lines += textwrap.wrap(
        "Every key and token (and PAYWIRE_DATABASE_URL) may be read from a file instead: "
        "VAR_FILE=/path (e.g. PAYWIRE_EVM_FACILITATOR_KEY_FILE); the file must be the service "
        "user's alone (mode 0400 or 0600), one trailing newline is dropped, and VAR and VAR_FILE "
        "may not both be set.", width=100, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


def _banner(settings: Settings, devnet: object) -> str:
    keys = devnet.keys  # type: ignore[attr-defined]
    bar = "=" * 78
    return "\n".join([
        bar,
        "  PAYWIRE DEVNET - payments settle on a LOCAL TEST CHAIN inside this process.",
        "  Devnet USDC has no value. For real networks set PAYWIRE_NETWORKS",
        "  (see docs/configuration.md).",
        bar,
        f"  gateway        {settings.base_url}",
        f"  catalogue      {settings.base_url}/api/marketplace/apis",
        f"  devnet info    {settings.base_url}/devnet",
        f"  EVM (Base Sepolia mirror, chain 84532)  rpc {settings.base_url}/devnet/evm",
        f"    demo payer   {keys.evm_payer_address}",
        f"    merchant     {keys.evm_merchant_address}",
        f"  Solana (devnet mirror)                  rpc {settings.base_url}/devnet/solana",
        f"    demo payer   {keys.sol_payer_address}",
        f"    merchant     {keys.sol_merchant_address}",
        f"  demo payer keys: {settings.data_dir / 'devnet-keys.json'} (used by `paywire pay`)",
        bar,
    ])


def run(args: argparse.Namespace) -> int:
    from agent.serving import STARTUP_FAILURE, CannotListen, listen

    try:
        settings = serve_settings(args)
    except ConfigError as exc:
        return config_error(exc)
    try:  # the port first: one in use is said before anything else is built or printed
        sock = listen(settings.host, settings.port, port_setting="--port or PAYWIRE_PORT")
    except CannotListen as exc:
        print(f"paywire: {exc}", file=sys.stderr)
        return STARTUP_FAILURE
    with sock:
        return _serve_on(sock, settings, args.log_level)


def _serve_on(sock: socket.socket, settings: Settings, log_level: str) -> int:
    try:
        _schema_ready(settings)  # before anything is built: the tables are this paywire's
    except ConfigError as exc:
        return config_error(exc)
    except DatabaseUnusable as exc:
        return database_error(exc)
    devnet = _devnet(settings)
    from agent.app import create_app
    from agent.hygiene import configure_logging
    from agent.serving import serve

    json_logs = settings.log_format == "json"
    configure_logging(log_level, json_lines=json_logs)
    try:
        app = create_app(settings, devnet=devnet)
    except ConfigError as exc:
        return config_error(exc)
    if devnet is not None:
        print(_banner(settings, devnet), file=sys.stderr, flush=True)
    else:
        from agent.banner import announce

        announce(settings, app.state.runtime)
    serve(app, host=settings.host, port=settings.port, log_level=log_level,
          header_timeout=settings.header_timeout_seconds, body_timeout=settings.body_timeout_seconds,
          json_logs=json_logs, trusted_proxies=settings.trusted_proxies, sock=sock)
    return 0


def _devnet(settings: Settings) -> object | None:
    """The devnet chains of a devnet gateway (None in production); a production install
    (`pip install .`) on devnet settings is told how to install them."""
    if not settings.devnet:
        return None
    from payments.devnet import Devnet, DevnetNotInstalled, check_installed
    from payments.devnet.keys import load_or_create_keys

    try:
        check_installed()  # before any key is written
        return Devnet(load_or_create_keys(settings.data_dir))
    except DevnetNotInstalled as exc:
        print(f"paywire: {exc}", file=sys.stderr)
        raise CommandFailed(CONFIG_ERROR) from None


def _schema_ready(settings: Settings) -> None:
    """`paywire serve`'s check before it listens: an empty database is created at head; a schema
    another paywire left is a ConfigError naming `paywire db upgrade` (the lifespan checks again,
    for apps served by other means)."""
    from payments.schema import SchemaError, ensure_current

    try:
        on_database(settings, ensure_current)
    except SchemaError as exc:
        raise schema_problem(settings, exc) from None
