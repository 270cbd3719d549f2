"""The `paywire` command: serve the gateway, show its configuration, pay for a call, check a
resource file, upgrade the database schema."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from .settings import ConfigError, PayerSettings, Settings, looks_secret
from .version import VERSION

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

CONFIG_ERROR = 2  # the exit code of every configuration problem
DEVNET_PORT = 8100  # `paywire devnet`, beside the gateway's 8000


def _config_error(exc: ConfigError, command: str = "paywire") -> int:
    """One line naming every problem, never a traceback."""
    print(f"{command}: configuration error: {' '.join(str(exc).split())}", file=sys.stderr)
    return CONFIG_ERROR


def _serve_settings(args: argparse.Namespace) -> Settings:
    env = dict(os.environ)
    if getattr(args, "host", None):
        env["PAYWIRE_HOST"] = args.host
    if getattr(args, "port", None):
        env["PAYWIRE_PORT"] = str(args.port)
    return Settings.from_env(env)


def _banner(settings: Settings, devnet: object) -> str:
    keys = devnet.keys  # type: ignore[attr-defined]
    bar = "=" * 78
    return "\n".join([
        bar,
        "  PAYWIRE DEVNET - payments settle on a LOCAL TEST CHAIN inside this process.",
        "  Devnet USDC has no value. Set PAYWIRE_NETWORKS (see README) for real networks.",
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


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = _serve_settings(args)
        _schema_ready(settings)  # before anything is built: the tables are this paywire's
    except ConfigError as exc:
        return _config_error(exc)
    except DatabaseUnusable as exc:
        return _database_error(exc)
    devnet = None
    if settings.devnet:
        from payments.devnet import Devnet, DevnetNotInstalled, check_installed
        from payments.devnet.keys import load_or_create_keys

        try:
            check_installed()  # before any key is written
            devnet = Devnet(load_or_create_keys(settings.data_dir))
        except DevnetNotInstalled as exc:  # a production install (`pip install .`) on devnet settings
            print(f"paywire: {exc}", file=sys.stderr)
            return CONFIG_ERROR
    from .app import create_app
    from .hygiene import configure_logging
    from .serving import serve

    configure_logging(args.log_level)

    try:
        app = create_app(settings, devnet=devnet)
    except ConfigError as exc:
        return _config_error(exc)
    if devnet is not None:
        print(_banner(settings, devnet), file=sys.stderr, flush=True)
    serve(app, host=settings.host, port=settings.port, log_level=args.log_level,
          header_timeout=settings.header_timeout_seconds, body_timeout=settings.body_timeout_seconds)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """The effective configuration, secrets masked; the variables resource files declare too.
    Exits 2 with the one-line message `paywire serve` would stop with."""
    from skills.resource_files import (
        BUILTIN_DIR,
        ResourceFileError,
        check_resource_dirs,
        declared_variables,
        read_resource_file,
    )

    try:
        settings = _serve_settings(args)
        problems = check_resource_dirs(settings.resource_dirs)
        if problems:
            raise ConfigError.of([f"PAYWIRE_RESOURCE_DIRS: {p}" for p in problems])
    except ConfigError as exc:
        return _config_error(exc)
    rows = [(variable, value, "environment" if given else "default")
            for variable, value, given in settings.effective()]
    known = {row[0] for row in rows}
    declared: dict[str, None] = {}
    for folder in [BUILTIN_DIR, *settings.resource_dirs]:
        for path in sorted(folder.glob("*.json")):
            try:
                declared.update(dict.fromkeys(declared_variables(read_resource_file(path))))
            except ResourceFileError:  # checked above
                continue
    resource_rows = []
    for variable in (v for v in declared if v not in known):
        value = settings.variables([variable]).get(variable, "")
        shown = "********" if value and looks_secret(variable) else value
        resource_rows.append((variable, shown, "environment" if value else "unset"))
    width = max(len(r[0]) for r in rows + resource_rows)
    print(f"# paywire {VERSION}: effective configuration (secrets masked); "
          "`paywire serve --help` says what each setting means")
    for variable, value, source in rows:
        print(f"{variable:<{width}}  {value or '-'}  ({source})")
    print("# read by resources (declared by their files' env and *_env fields)")
    for variable, value, source in resource_rows:
        print(f"{variable:<{width}}  {value or '-'}  ({source})")
    return 0


def _settings_help() -> str:
    """Every setting, its default and meaning, for `paywire serve --help`."""
    lines = ["settings (environment variables; `paywire config` prints the effective values):"]
    for variable, default, meaning in Settings.reference():
        text = f"{variable} (default {default}): {meaning}" if default != "-" else f"{variable}: {meaning}"
        lines += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="      ")
    lines.append("  Resource files declare the variables they read (`env`, `*_env` fields), e.g. "
                 "NANSEN_API_KEY;")
    lines.append("  `paywire config` lists them.")
    return "\n".join(lines)


def _demo_keys(data_dir: Path) -> object | None:
    from payments.devnet.keys import KEYS_FILE, DevnetKeys

    path = data_dir / KEYS_FILE
    if not path.exists():
        return None
    return DevnetKeys(**json.loads(path.read_text()))


def _devnet_solana_rpc(url: str) -> str | None:
    """A devnet paywire announces its Solana RPC at /devnet; other servers do not."""
    import httpx

    parts = urlsplit(url)
    try:
        info = httpx.get(f"{parts.scheme}://{parts.netloc}/devnet", timeout=5).json()
        return info["networks"]["solana"]["rpc_url"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def cmd_pay(args: argparse.Namespace) -> int:
    from payments.money import display_usd, usd_text
    from payments.payer import PayerKeys, PayError, pay

    try:
        max_usd = Decimal(args.max.removeprefix("$"))
    except InvalidOperation:
        print(f"paywire pay: --max must be a USD amount such as 0.10, got {args.max!r}",
              file=sys.stderr)
        return 2
    try:
        payer = PayerSettings.from_env()
    except ConfigError as exc:
        return _config_error(exc, "paywire pay")
    secret = payer.payer_key.get_secret_value() if payer.payer_key else ""
    solana_rpc = args.solana_rpc or payer.solana_rpc_url or None
    try:
        if secret:
            keys = PayerKeys.from_secret(secret)
        else:
            demo = _demo_keys(payer.data_dir)
            if demo is None:
                raise PayError("no payer key: set PAYWIRE_PAYER_KEY, or run `paywire serve` "
                               "(devnet) from this folder first to create the demo payer")
            keys = PayerKeys(evm_key=demo.evm_payer, solana_key=demo.sol_payer)  # type: ignore[attr-defined]
            if solana_rpc is None:
                solana_rpc = _devnet_solana_rpc(args.url)
        headers = {}
        for h in args.header or []:
            name, sep, value = h.partition(":")
            if not sep:
                raise PayError(f"-H expects 'Name: value', got {h!r}")
            headers[name.strip()] = value.strip()

        def confirm(question: str) -> bool:
            if args.yes:
                return True
            if not sys.stdin.isatty():
                return False
            return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")

        data = args.data.encode() if args.data is not None else None
        result = asyncio.run(pay(
            args.url, keys=keys, method=args.method, data=data, headers=headers,
            network=args.network, max_usd=max_usd, confirm=confirm, solana_rpc_url=solana_rpc,
        ))
    except PayError as exc:
        print(f"paywire pay: {exc}", file=sys.stderr)
        return 2
    body_text = result.body.decode("utf-8", errors="replace")
    receipt = result.receipt
    if args.json:
        try:
            body: object = json.loads(body_text)
        except ValueError:
            body = body_text
        print(json.dumps({
            "status": result.status,
            "result": body,
            "receipt": receipt.model_dump(by_alias=True, exclude_none=True) if receipt else None,
            "paid_usd": usd_text(result.paid_usd) if result.paid_usd is not None else None,
        }, indent=2))
    else:
        print(f"HTTP {result.status}")
        print(body_text)
        if receipt is not None:
            print("receipt:")
            print(f"  success      {receipt.success}")
            print(f"  transaction  {receipt.transaction}")
            print(f"  network      {receipt.network}")
            print(f"  payer        {receipt.payer}")
            amount = receipt.amount or "?"
            paid = f" ({display_usd(result.paid_usd)})" if result.paid_usd is not None else ""
            print(f"  amount       {amount} atomic units{paid}")
            if receipt.error_reason:
                print(f"  error        {receipt.error_reason}")
    return 0 if 200 <= result.status < 300 else 1


def cmd_devnet(args: argparse.Namespace) -> int:
    from .devnet_server import run

    return run(host=args.host, port=args.port, data_dir=args.data_dir, env_file=args.env_file,
               public_url=args.public_url, log_level=args.log_level)


def cmd_skills_check(args: argparse.Namespace) -> int:
    from skills.resource_files import ResourceFileError, check_resource, read_resource_file

    worst = 0
    for path in _resource_paths(args.files):
        try:
            data = read_resource_file(path)
        except ResourceFileError as exc:
            print(f"{path}: {exc.problems[0]}")
            worst = 1
            continue
        problems = check_resource(data, str(path))
        if problems:
            worst = 1
            print(f"{path}: {len(problems)} problem(s)")
            for p in problems:
                print(f"  - {p}")
        else:
            needs = (data.get("upstream") or {}).get("api_key_env")
            print(f"{path}: ok ({data['id']}, {data['kind']}, ${data['price']} per call"
                  + (f"; needs {needs} on the gateway" if needs else "") + ")")
    return worst


def _resource_paths(names: list[str]) -> list[Path]:
    """The files named, and the `*.json` files of the folders named."""
    paths: list[Path] = []
    for name in names:
        path = Path(name)
        paths += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return paths


# ---- paywire db: the ledger's schema (payments/schema.py, migrations in payments/migrations/) ----

DB_VARIABLES = ("variables read: PAYWIRE_DATABASE_URL (a SQLAlchemy URL with an async driver, e.g. "
                "postgresql+asyncpg://user:pass@host/db; default: the SQLite file paywire.db in "
                "PAYWIRE_DATA_DIR), PAYWIRE_DATA_DIR (default .paywire). The other settings of "
                "`paywire serve --help` are checked as `paywire serve` checks them. A configuration "
                f"problem is one line on stderr and exit code {CONFIG_ERROR}; a database that cannot "
                "be reached or refuses a statement, one line and exit code 1.")


class DatabaseUnusable(Exception):
    """The database could not be reached, or refused a statement: one line, never a traceback."""


def _db_settings(args: argparse.Namespace) -> Settings:
    env = dict(os.environ)
    if getattr(args, "database_url", None):
        env["PAYWIRE_DATABASE_URL"] = args.database_url
    if getattr(args, "data_dir", None):
        env["PAYWIRE_DATA_DIR"] = args.data_dir
    return Settings.from_env(env)


def _db_where(settings: Settings) -> str:
    """The variable that names the database, and the database (password hidden)."""
    from sqlalchemy.engine import make_url

    if settings.database_url:
        return f"PAYWIRE_DATABASE_URL {make_url(settings.database_url).render_as_string(hide_password=True)}"
    return f"PAYWIRE_DATA_DIR {settings.data_dir} (SQLite file {make_url(settings.db_url).database})"


def _on_database(settings: Settings, work: Callable[[AsyncEngine], Awaitable[T]], *,
                 create: bool = True) -> T | None:
    """`work(engine)` on the configured database, in its own event loop; DatabaseUnusable for what
    the database itself refuses. Without `create`, a SQLite file that does not exist is left
    uncreated (None)."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.db_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        if not create and not Path(url.database).exists():
            return None
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_with_engine(settings, work))


async def _with_engine(settings: Settings, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import create_async_engine

    url = make_url(settings.db_url)
    sqlite = url.get_backend_name() == "sqlite"
    engine = create_async_engine(url, connect_args={"timeout": 30} if sqlite else {})
    try:
        return await work(engine)
    except (DBAPIError, OSError) as exc:
        cause = getattr(exc, "orig", None) or exc
        raise DatabaseUnusable(f"{_db_where(settings)}: {type(cause).__name__}: {cause}") from None
    finally:
        await engine.dispose()


def _schema_ready(settings: Settings) -> None:
    """`paywire serve`'s check before it listens: an empty database is created at head; a schema
    another paywire left is a ConfigError naming `paywire db upgrade` (the lifespan checks again,
    for apps served by other means)."""
    from payments.schema import SchemaError, ensure_current

    try:
        _on_database(settings, ensure_current)
    except SchemaError as exc:
        raise ConfigError(f"{_db_where(settings)}: {exc}") from None


def _database_error(exc: DatabaseUnusable, command: str = "paywire") -> int:
    print(f"{command}: database error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 1


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from payments.schema import SchemaError, upgrade

    try:
        settings = _db_settings(args)
        before, after = _on_database(settings, upgrade)  # type: ignore[misc]
    except ConfigError as exc:
        return _config_error(exc, "paywire db upgrade")
    except SchemaError as exc:  # a newer paywire's schema
        return _config_error(ConfigError(f"{_db_where(settings)}: {exc}"), "paywire db upgrade")
    except DatabaseUnusable as exc:
        return _database_error(exc, "paywire db upgrade")
    if before is None:
        print(f"created the schema at revision {after}: {_db_where(settings)}")
    elif before == after:
        print(f"already at revision {after}, nothing to do: {_db_where(settings)}")
    else:
        print(f"upgraded the schema from revision {before} to {after}: {_db_where(settings)}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from payments.schema import head_revision, schema_state

    try:
        settings = _db_settings(args)
        found = _on_database(settings, schema_state, create=False)
    except ConfigError as exc:
        return _config_error(exc, "paywire db current")
    except DatabaseUnusable as exc:
        return _database_error(exc, "paywire db current")
    state, revision = found or ("empty", None)
    head = head_revision()
    said = {
        "current": "current: the revision this paywire runs on",
        "empty": f"empty: no paywire tables yet (`paywire serve` or `paywire db upgrade` creates them "
                 f"at {head})",
        "outdated": f"outdated: this paywire needs {head}; run `paywire db upgrade`",
        "ahead": f"ahead: a newer paywire's schema; this one runs on {head}",
    }[state]
    print(f"{revision or 'none'} ({said})")
    print(f"database: {_db_where(settings)}")
    return 0 if state == "current" else 1


def cmd_ledger(args: argparse.Namespace) -> int:
    from payments.ledger import Ledger
    from payments.schema import SchemaError, ensure_current

    from .ledger_report import report

    async def show(engine: AsyncEngine) -> str:
        await ensure_current(engine, create_if_empty=False)
        ledger = Ledger(engine)
        try:
            return await report(ledger, state=args.state, events=args.events,
                                limit=args.limit, as_json=args.json)
        finally:
            ledger.close()

    try:
        settings = _db_settings(args)
        text = _on_database(settings, show, create=False)
    except ConfigError as exc:
        return _config_error(exc, "paywire ledger")
    except SchemaError as exc:
        return _config_error(ConfigError(f"{_db_where(settings)}: {exc}"), "paywire ledger")
    except DatabaseUnusable as exc:
        return _database_error(exc, "paywire ledger")
    print(text if text is not None else f"no ledger yet: {_db_where(settings)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paywire", description=__doc__)
    parser.add_argument("--version", action="version", version=f"paywire {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (devnet unless configured)",
                           description="Run the gateway: devnet unless PAYWIRE_NETWORKS names real "
                           "networks. A configuration problem stops it with one line naming every "
                           f"variable at fault (exit code {CONFIG_ERROR}).",
                           epilog=_settings_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", help="address to listen on (overrides PAYWIRE_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (overrides PAYWIRE_PORT)")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="log level (default: info; info and below log each request)")
    serve.set_defaults(func=cmd_serve)

    config = sub.add_parser("config", help="print the effective configuration (secrets masked)",
                            description="Print every setting's effective value (secrets masked) and "
                            "where it comes from, and the variables resource files declare. Exits "
                            f"{CONFIG_ERROR} with the message `paywire serve` would stop with.")
    config.add_argument("--host", help="as `paywire serve --host`")
    config.add_argument("--port", type=int, help="as `paywire serve --port`")
    config.set_defaults(func=cmd_config)

    payp = sub.add_parser("pay", help="call an x402 URL and pay for it")
    payp.add_argument("url")
    payp.add_argument("--data", "-d", help="request body (JSON)")
    payp.add_argument("--method", "-X", default="POST")
    payp.add_argument("--header", "-H", action="append", help="extra header 'Name: value'")
    payp.add_argument("--network", help="evm, solana, or a network id (default: first offered)")
    payp.add_argument("--max", default="0.10", help="most USD to pay without asking (0.10)")
    payp.add_argument("--yes", "-y", action="store_true", help="pay above --max without asking")
    payp.add_argument("--solana-rpc", help="Solana RPC URL for building the payment")
    payp.add_argument("--json", action="store_true", help="print one JSON document")
    payp.set_defaults(func=cmd_pay)

    devnet = sub.add_parser(
        "devnet", help="run the devnet chains as their own process (gateways use them over RPC)",
        description="Serve the devnet chains (EVM mirroring Base Sepolia, Solana mirroring Solana "
        "devnet; state in memory) on their own, so several production-mode gateways settle on "
        "one chain and the chain outlives a gateway. Routes: GET /devnet, GET /devnet/balance, "
        "POST /devnet/faucet, POST /devnet/evm and /devnet/solana (JSON-RPC), GET /healthz. "
        "Prints the settings a gateway needs; the facilitator keys only go to --env-file.")
    devnet.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1)")
    devnet.add_argument("--port", type=int, default=DEVNET_PORT,
                        help=f"port to listen on (default: {DEVNET_PORT}; 0 picks a free one, "
                        "named in the printed URLs and the env file)")
    devnet.add_argument("--data-dir", type=Path, default=Path(".paywire"),
                        help="folder of the devnet keys, created on first start (default: .paywire,"
                        " where `paywire pay` finds the demo payer)")
    devnet.add_argument("--env-file", type=Path,
                        help="write the production-mode gateway settings here, facilitator keys "
                        "included (mode 0600; `set -a; . FILE; set +a` before `paywire serve`)")
    devnet.add_argument("--public-url",
                        help="base URL gateways reach the devnet at, used in the RPC URLs "
                        "(default: http://HOST:PORT)")
    devnet.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="log level (default: warning; info logs each request)")
    devnet.set_defaults(func=cmd_devnet)

    skills = sub.add_parser("skills", help="skill authoring tools")
    skills_sub = skills.add_subparsers(dest="skills_command", required=True)
    check = skills_sub.add_parser("check", help="validate resource files (or folders of them)")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=cmd_skills_check)

    db = sub.add_parser("db", help="the database schema: upgrade it, show its revision",
                        description="The ledger's tables are versioned (Alembic revisions shipped "
                        "with paywire). `paywire serve` creates an empty database at the current "
                        "revision and refuses to start on an older one: run `paywire db upgrade` "
                        "(after a backup) when a new paywire says so.", epilog=DB_VARIABLES)
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_upgrade = db_sub.add_parser(
        "upgrade", help="apply the migrations: bring the database to this paywire's revision",
        description="Bring the configured database to the revision this paywire runs on: an empty "
        "one is created, an older one migrated. Back up the "
        "database first. One transaction: a failure changes nothing. A database a newer paywire "
        f"upgraded is refused (exit code {CONFIG_ERROR}).", epilog=DB_VARIABLES)
    db_current = db_sub.add_parser(
        "current", help="print the database's revision and whether it is current",
        description="Print the configured database's schema revision and whether it is the one "
        "this paywire runs on (current), older (outdated: run `paywire db upgrade`), missing "
        "(empty) or newer (ahead). Changes nothing. Exit code 0 when current, 1 otherwise.",
        epilog=DB_VARIABLES)
    for db_parser in (db_upgrade, db_current):
        db_parser.add_argument("--database-url", metavar="URL",
                               help="the database (overrides PAYWIRE_DATABASE_URL)")
        db_parser.add_argument("--data-dir", metavar="DIR",
                               help="folder of the default SQLite database (overrides PAYWIRE_DATA_DIR)")
    db_upgrade.set_defaults(func=cmd_db_upgrade)
    db_current.set_defaults(func=cmd_db_current)

    ledger = sub.add_parser(
        "ledger", help="the payments: counts by state, unfinished and stuck ones, the reconciler",
        description="What the payment ledger holds. With no option: payments and amounts by state, "
        "then the unfinished ones (claimed, settling, pending), oldest first, marked STUCK once "
        "their lease ran out and the reconciler has not settled them yet. Reads only.",
        epilog=DB_VARIABLES)
    ledger.add_argument("--state", choices=[s.value for s in _payment_states()],
                        help="list the latest payments in this state instead")
    ledger.add_argument("--events", action="store_true",
                        help="list what the reconciler did (settled or released a payment), newest first")
    ledger.add_argument("--limit", type=int, default=50, metavar="N",
                        help="at most N payments or events (default: 50)")
    ledger.add_argument("--json", action="store_true", help="print JSON instead of text")
    ledger.add_argument("--database-url", metavar="URL",
                        help="the database (overrides PAYWIRE_DATABASE_URL)")
    ledger.add_argument("--data-dir", metavar="DIR",
                        help="folder of the default SQLite database (overrides PAYWIRE_DATA_DIR)")
    ledger.set_defaults(func=cmd_ledger)
    return parser


def _payment_states() -> list[Any]:
    from payments.ledger_schema import PaymentState

    return list(PaymentState)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
