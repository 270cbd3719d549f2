"""The `paywire` command: serve the gateway, show its configuration, pay for a call, check a
resource file, upgrade the database schema."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Awaitable, Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from agent.settings import ConfigError, PayerSettings, Settings, looks_secret
from agent.version import VERSION

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
    from agent.app import create_app
    from agent.hygiene import configure_logging
    from agent.serving import serve

    json_logs = settings.log_format == "json"
    configure_logging(args.log_level, json_lines=json_logs)

    try:
        app = create_app(settings, devnet=devnet)
    except ConfigError as exc:
        return _config_error(exc)
    if devnet is not None:
        print(_banner(settings, devnet), file=sys.stderr, flush=True)
    else:
        from agent.banner import announce

        announce(settings, app.state.runtime)
    serve(app, host=settings.host, port=settings.port, log_level=args.log_level,
          header_timeout=settings.header_timeout_seconds, body_timeout=settings.body_timeout_seconds,
          json_logs=json_logs, trusted_proxies=settings.trusted_proxies)
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
    lines += textwrap.wrap(
        "Every key and token (and PAYWIRE_DATABASE_URL) may be read from a file instead: "
        "VAR_FILE=/path (e.g. PAYWIRE_EVM_FACILITATOR_KEY_FILE); the file must be the service "
        "user's alone (mode 0400 or 0600), one trailing newline is dropped, and VAR and VAR_FILE "
        "may not both be set.", width=100, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


def _default(variable: str) -> str:
    """A setting's default as text (`paywire serve --help` lists them all)."""
    return next(default for name, default, _ in Settings.reference() if name == variable)


def _payer_help(command: str = "pay") -> str:
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


def _payer_keys(payer: PayerSettings, solana_rpc: str | None, url: str) -> tuple[Any, str | None]:
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
    return keys, solana_rpc or _devnet_solana_rpc(url)


def cmd_pay(args: argparse.Namespace) -> int:
    from payments.money import display_usd, usd_text
    from payments.payer import PayError, pay

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
    try:
        keys, solana_rpc = _payer_keys(payer, args.solana_rpc, args.url)
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


def _mcp_settings(args: argparse.Namespace) -> PayerSettings:
    """PayerSettings with the options of `paywire mcp` in place of their variables (checked alike)."""
    env = dict(os.environ)
    for option, variable in (("server", "PAYWIRE_MCP_SERVER_URL"), ("network", "PAYWIRE_MCP_NETWORK"),
                             ("max_per_call", "PAYWIRE_MCP_MAX_PER_CALL"),
                             ("max_per_day", "PAYWIRE_MCP_MAX_PER_DAY"), ("ledger", "PAYWIRE_MCP_LEDGER"),
                             ("solana_rpc", "PAYWIRE_SOLANA_RPC_URL")):
        value = getattr(args, option, None)
        if value is not None:
            env[variable] = str(value)
    try:
        return PayerSettings.from_env(env)
    except ConfigError as exc:  # name the option the user typed, not only its variable
        given = {"PAYWIRE_MCP_SERVER_URL": "--server", "PAYWIRE_MCP_NETWORK": "--network",
                 "PAYWIRE_MCP_MAX_PER_CALL": "--max-per-call", "PAYWIRE_MCP_MAX_PER_DAY": "--max-per-day",
                 "PAYWIRE_MCP_LEDGER": "--ledger", "PAYWIRE_SOLANA_RPC_URL": "--solana-rpc"}
        problems = []
        for problem in exc.problems:
            variable = problem.split(" ", 1)[0]
            option = given.get(variable)
            if option and getattr(args, option.removeprefix("--").replace("-", "_"), None) is not None:
                problem = f"{option} ({variable}){problem[len(variable):]}"
            problems.append(problem)
        raise ConfigError.of(problems) from None


def cmd_mcp(args: argparse.Namespace) -> int:
    from agent.mcp.proxy import Caps, ProxyConfig, ProxyError, configure_logging, serve_stdio
    from payments.payer import PayError

    try:
        settings = _mcp_settings(args)
    except ConfigError as exc:
        return _config_error(exc, "paywire mcp")
    if args.spent:
        return _print_spent(settings, args)
    if not settings.mcp_server_url:
        print("paywire mcp: no server: pass --server URL (the remote MCP endpoint, e.g. "
              "https://gateway.example/mcp) or set PAYWIRE_MCP_SERVER_URL", file=sys.stderr)
        return CONFIG_ERROR
    configure_logging(args.log_level)
    try:
        keys, solana_rpc = _payer_keys(settings, None, settings.mcp_server_url)
    except PayError as exc:
        print(f"paywire mcp: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    config = ProxyConfig(
        server_url=settings.mcp_server_url, keys=keys, network=settings.mcp_network,
        caps=Caps(per_call=settings.mcp_max_per_call, per_day=settings.mcp_max_per_day),
        ledger_path=settings.mcp_ledger_path, solana_rpc_url=solana_rpc)
    try:
        asyncio.run(serve_stdio(config))
    except ProxyError as exc:
        print(f"paywire mcp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _print_spent(settings: PayerSettings, args: argparse.Namespace) -> int:
    """Today's total against the daily cap, then the latest payments (exact decimals)."""
    from payments.money import display_usd, usd_text
    from payments.spend_caps import SpendLedger, micros_usd

    if not 1 <= args.limit <= 1000:
        print(f"paywire mcp: --limit must be from 1 to 1000, got {args.limit}", file=sys.stderr)
        return CONFIG_ERROR
    path = settings.mcp_ledger_path
    if not path.exists():
        print(f"paywire mcp: no spend ledger at {path} yet (nothing paid; --ledger or "
              "PAYWIRE_MCP_LEDGER names another)", file=sys.stderr)
        return 1
    ledger = SpendLedger(path)
    day, spent = ledger.spent_today()
    rows = ledger.recent(args.limit)
    if args.json:
        print(json.dumps({"day": day, "spent_usd": usd_text(micros_usd(spent)),
                          "max_per_day_usd": usd_text(settings.mcp_max_per_day),
                          "max_per_call_usd": usd_text(settings.mcp_max_per_call),
                          "payments": [row.as_json() for row in rows]}, indent=2))
        return 0
    print(f"today (UTC {day}): {display_usd(micros_usd(spent))} counted of "
          f"{display_usd(settings.mcp_max_per_day)} a day; at most "
          f"{display_usd(settings.mcp_max_per_call)} a call; ledger {path}")
    print(f"{'time (UTC)':<27}  {'status':<8}  {'USD':>10}  {'network':<41}  tool  (server)  transaction")
    for row in rows:
        print(f"{row.created_at:<27}  {row.status:<8}  {usd_text(row.usd):>10}  {row.network:<41}  "
              f"{row.tool}  ({row.server})  {row.tx_hash or '-'}")
    return 0


def cmd_devnet(args: argparse.Namespace) -> int:
    from agent.devnet.server import run

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
        env.pop("PAYWIRE_DATABASE_URL_FILE", None)  # the option wins over both forms
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
    from agent.cli.ledger_report import report
    from payments.ledger import Ledger
    from payments.schema import SchemaError, ensure_current

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


def _ledger_export(args: argparse.Namespace, command: str,
                   write: Callable[[AsyncEngine, Any], Awaitable[Any]]) -> int:
    """Run `write(engine, out)` on the ledger's database, `out` stdout or --output FILE (written
    next to it, then renamed into place: an interrupted export leaves no half file)."""
    from payments.schema import SchemaError, ensure_current

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
        settings = _db_settings(args)
        done = _on_database(settings, run, create=False)
        finished = True
    except ConfigError as exc:
        return _config_error(exc, command)
    except SchemaError as exc:
        return _config_error(ConfigError(f"{_db_where(settings)}: {exc}"), command)
    except DatabaseUnusable as exc:
        return _database_error(exc, command)
    except _OutputFailed as exc:  # --output cannot be written
        cause = exc.args[0]
        print(f"{command}: --output {output}: {getattr(cause, 'strerror', None) or cause}",
              file=sys.stderr)
        return 1
    finally:
        if partial is not None and not finished:
            partial.unlink(missing_ok=True)
    if done is None:
        print(f"{command}: no ledger yet: {_db_where(settings)}", file=sys.stderr)
        return 1
    if output is not None:
        if partial is not None:
            partial.replace(output)
        print(f"{command}: wrote {output}", file=sys.stderr)
    return 0


def _period_and_filters(args: argparse.Namespace, command: str) -> tuple[Any, Any] | int:
    from payments.accounting import AccountingInputError, PaymentFilter, Period

    try:
        period = Period.of(since=args.since, until=args.until, month=args.month)
        filters = PaymentFilter(
            state=getattr(args, "filter_state", None), skill=getattr(args, "skill", None),
            network=getattr(args, "network", None), payer=getattr(args, "payer", None),
            tx=getattr(args, "tx", None), period=period)
    except AccountingInputError as exc:
        print(f"{command}: --{exc.field}: {exc.message}", file=sys.stderr)
        return CONFIG_ERROR
    return period, filters


def cmd_ledger_revenue(args: argparse.Namespace) -> int:
    from agent.cli.accounting_report import write_revenue
    from payments.accounting import AccountingInputError, parse_by

    command = "paywire ledger revenue"
    parsed = _period_and_filters(args, command)
    if isinstance(parsed, int):
        return parsed
    period, _ = parsed
    try:
        by = parse_by(args.by)
    except AccountingInputError as exc:
        print(f"{command}: --{exc.field}: {exc.message}", file=sys.stderr)
        return CONFIG_ERROR
    return _ledger_export(args, command, lambda engine, out: write_revenue(
        engine, out, by=by, period=period, fmt=args.format))


def cmd_ledger_payments(args: argparse.Namespace) -> int:
    from agent.cli.accounting_report import write_payments
    from payments.accounting import MAX_PAGE

    command = "paywire ledger payments"
    parsed = _period_and_filters(args, command)
    if isinstance(parsed, int):
        return parsed
    _, filters = parsed
    if not 1 <= args.rows <= MAX_PAGE:
        print(f"{command}: --limit: a whole number from 1 to {MAX_PAGE} (--all for every payment), "
              f"got {args.rows}", file=sys.stderr)
        return CONFIG_ERROR
    return _ledger_export(args, command, lambda engine, out: write_payments(
        engine, out, filters=filters, limit=args.rows, every=args.all, fmt=args.format))


def _ledger_export_parsers(ledger: argparse.ArgumentParser) -> None:
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
    # SUPPRESS: given before the command (`paywire ledger --data-dir D revenue`), the value stays
    common.add_argument("--database-url", metavar="URL", default=argparse.SUPPRESS,
                        help="the database (default: PAYWIRE_DATABASE_URL, else the SQLite file "
                        "paywire.db in the data folder)")
    common.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS,
                        help=f"folder of the default SQLite database (default: PAYWIRE_DATA_DIR, "
                        f"else {_default('PAYWIRE_DATA_DIR')})")
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
    revenue.set_defaults(func=cmd_ledger_revenue)
    payments = exports.add_parser(
        "payments", parents=[common], epilog=DB_VARIABLES,
        help="the payments, filtered: a table, CSV or JSON",
        description="The payments created in a period that match every filter given: the latest "
        "--limit of them, newest first, or with --all every one, oldest first, streamed (a month "
        "of any size). Example: paywire ledger payments --month 2026-11 --state settled --all "
        "--format csv -o payments-2026-11.csv")
    payments.add_argument("--state", dest="filter_state",
                          choices=[s.value for s in _payment_states()],
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
    payments.set_defaults(func=cmd_ledger_payments)


# ---- paywire skills disable|enable, paywire payers deny|allow|list: the operator's controls ----

CONTROLS_VARIABLES = (
    "variables read: PAYWIRE_DATABASE_URL (the database the gateways share; a SQLAlchemy URL with an "
    "async driver; default: the SQLite file paywire.db in PAYWIRE_DATA_DIR), PAYWIRE_DATA_DIR "
    "(default .paywire); for skill ids, the settings that decide what is sold (PAYWIRE_RESOURCE_DIRS, "
    "PAYWIRE_MODELS_FILE...), as `paywire serve` reads them. Running gateways follow a change within "
    "PAYWIRE_CONTROLS_REFRESH_SECONDS (default 2). The operator API (/admin) does the same over HTTP. "
    f"A configuration problem is one line on stderr and exit code {CONFIG_ERROR}; a database that "
    "cannot be reached, one line and exit code 1.")


def _sold_skill_ids(settings: Settings) -> set[str]:
    """The ids the gateway would sell with these settings (resources, models, help)."""
    from agent.app import build_registry
    from skills.help import HELP_SKILL
    from skills.models.upstream import UpstreamClient

    return {s.id for s in build_registry(settings, UpstreamClient()).all()} | {HELP_SKILL}


def _controls_command(args: argparse.Namespace, command: str,
                      work: Callable[[Any], Awaitable[str]], *, skill_id: str | None = None) -> int:
    """`work(controls)` on the configured database (schema current); prints what it returns."""
    from payments.controls import ControlError, Controls
    from payments.schema import SchemaError, ensure_current

    async def run(engine: AsyncEngine) -> str:
        await ensure_current(engine)
        return await work(Controls(engine))

    try:
        settings = _db_settings(args)
        if skill_id is not None and skill_id not in _sold_skill_ids(settings):
            raise ConfigError(f"no skill named {skill_id!r} is sold with these settings; "
                              "GET /api/marketplace/apis and /v1/models list the ids")
        print(_on_database(settings, run))
    except ControlError as exc:
        return _config_error(ConfigError(exc.message), command)
    except ConfigError as exc:
        return _config_error(exc, command)
    except SchemaError as exc:
        return _config_error(ConfigError(f"{_db_where(settings)}: {exc}"), command)
    except DatabaseUnusable as exc:
        return _database_error(exc, command)
    return 0


def _operator() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"paywire CLI ({user}@{socket.gethostname()})"


def cmd_skills_switch(args: argparse.Namespace) -> int:
    enabled = args.skills_command == "enable"

    async def work(controls: Any) -> str:
        await controls.set_skill(args.skill_id, enabled=enabled, reason=args.reason,
                                 changed_by=_operator())
        return (f"{args.skill_id}: switched on" if enabled else
                f"{args.skill_id}: switched off (calls answer 503 before any quote)")

    return _controls_command(args, f"paywire skills {args.skills_command}", work,
                             skill_id=None if enabled else args.skill_id)


def cmd_skills_disabled(args: argparse.Namespace) -> int:
    async def work(controls: Any) -> str:
        found = await controls.disabled_skills()
        return "\n".join(f"{s.skill_id}\t{s.changed_at:%Y-%m-%d %H:%M:%S}\t{s.changed_by}\t"
                         f"{s.reason or ''}" for s in found) or "no skill is switched off"

    return _controls_command(args, "paywire skills disabled", work)


def cmd_payers(args: argparse.Namespace) -> int:
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

    return _controls_command(args, f"paywire payers {args.payers_command}", work)


def _add_control_commands(sub: Any, skills_sub: Any) -> None:
    def database_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--database-url", metavar="URL",
                            help="the database the gateways share (default: PAYWIRE_DATABASE_URL, "
                            "else the SQLite file paywire.db in the data folder)")
        parser.add_argument("--data-dir", metavar="DIR",
                            help="folder of the default SQLite database (default: PAYWIRE_DATA_DIR, "
                            f"else {_default('PAYWIRE_DATA_DIR')})")

    reason_help = "why, shown to callers of a switched-off skill (at most 500 characters; default: none)"
    disable = skills_sub.add_parser(
        "disable", help="switch a skill off on every gateway sharing the database",
        description="Switch a skill (a resource or a model, by id) off without a restart: every "
        "gateway on this database answers its calls 503 skill_disabled before any quote, and lists "
        "it with \"available\": false. The id must be one these settings sell.",
        epilog=CONTROLS_VARIABLES)
    disable.add_argument("skill_id", metavar="ID", help="the skill's id (a resource_id or a model id)")
    disable.add_argument("--reason", help=reason_help)
    enable = skills_sub.add_parser(
        "enable", help="switch a skill on again",
        description="Switch a skill on again on every gateway sharing the database (any id: a "
        "skill no longer sold can be cleared too).", epilog=CONTROLS_VARIABLES)
    enable.add_argument("skill_id", metavar="ID", help="the skill's id")
    enable.set_defaults(reason=None)
    disabled = skills_sub.add_parser(
        "disabled", help="list the skills switched off",
        description="List the skills switched off: id, when, by whom, why (tab-separated).",
        epilog=CONTROLS_VARIABLES)
    for parser in (disable, enable):
        database_options(parser)
        parser.set_defaults(func=cmd_skills_switch)
    database_options(disabled)
    disabled.set_defaults(func=cmd_skills_disabled)

    payers = sub.add_parser(
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
        database_options(parser)
        parser.set_defaults(func=cmd_payers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paywire", description=__doc__,
                                     epilog="`paywire COMMAND --help`: the command's options, their "
                                     "defaults and the environment variables it reads.")
    parser.add_argument("--version", action="version", version=f"paywire {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (devnet unless configured)",
                           description="Run the gateway: devnet unless PAYWIRE_NETWORKS names real "
                           "networks. A configuration problem stops it with one line naming every "
                           f"variable at fault (exit code {CONFIG_ERROR}).",
                           epilog=_settings_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", help="address to listen on (default: PAYWIRE_HOST, else "
                       f"{_default('PAYWIRE_HOST')})")
    serve.add_argument("--port", type=int, help="port to listen on (default: PAYWIRE_PORT, else "
                       f"{_default('PAYWIRE_PORT')})")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="log level (default: %(default)s; info and below log each request)")
    serve.set_defaults(func=cmd_serve)

    config = sub.add_parser("config", help="print the effective configuration (secrets masked)",
                            description="Print every setting's effective value (secrets masked) and "
                            "where it comes from, and the variables resource files declare. Exits "
                            f"{CONFIG_ERROR} with the message `paywire serve` would stop with.",
                            epilog="variables read: every setting `paywire serve --help` lists "
                            "(PAYWIRE_*, the model providers' keys and base URLs), and the variables "
                            "resource files declare (their `env` and `*_env` fields, e.g. "
                            "NANSEN_API_KEY).")
    config.add_argument("--host", help="as `paywire serve --host` (default: PAYWIRE_HOST, else "
                        f"{_default('PAYWIRE_HOST')})")
    config.add_argument("--port", type=int, help="as `paywire serve --port` (default: PAYWIRE_PORT, "
                        f"else {_default('PAYWIRE_PORT')})")
    config.set_defaults(func=cmd_config)

    payp = sub.add_parser(
        "pay", help="call an x402 URL and pay for it",
        description="\n".join(textwrap.wrap(
            "Call a URL of any x402 server; if it answers 402, choose a payment option the key can "
            "pay, check the price against --max, sign the payment and call again; print the answer "
            "and the settlement receipt. A payment the server is still settling is sent again, "
            "never signed twice. Exit code 0 on a 2xx answer, 1 on another, 2 when it refused to "
            "pay (a bad option, no usable key, a price above --max).", width=100)),
        epilog=_payer_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
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
    payp.add_argument("--solana-rpc", metavar="URL",
                      help="the Solana node a Solana payment is built with (default: "
                      "PAYWIRE_SOLANA_RPC_URL, else the devnet's when the server is a paywire devnet)")
    payp.add_argument("--json", action="store_true",
                      help="print one JSON document (status, result, receipt, paid_usd)")
    payp.set_defaults(func=cmd_pay)

    mcpp = sub.add_parser(
        "mcp", help="a local stdio MCP server that pays a remote x402 MCP server's tools, within caps",
        description="\n".join(textwrap.wrap(
            "Serve MCP on stdin/stdout for a desktop agent (the command of its MCP config): the "
            "tools of a remote MCP server (streamable HTTP: a paywire's /mcp, or any x402 MCP "
            "server), paid from your key when the remote asks (x402's MCP transport). A payment "
            "over --max-per-call, or past --max-per-day (UTC days; every payment not proven unspent "
            "counts), is refused before anything is signed, and the tool call answers an error "
            "saying which cap and how to raise it. Every payment is recorded in the spend ledger "
            "(--spent prints it). Logs go to stderr, never the key, a payment or tool arguments.",
            width=100)),
        epilog=_payer_help("mcp"), formatter_class=argparse.RawDescriptionHelpFormatter)
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
    mcpp.add_argument("--solana-rpc", metavar="URL",
                      help="the Solana node a Solana payment is built with (default: "
                      "PAYWIRE_SOLANA_RPC_URL, else the devnet's when the server is a paywire devnet)")
    mcpp.add_argument("--spent", action="store_true",
                      help="print today's total and the latest payments from the ledger, and exit")
    mcpp.add_argument("--limit", type=int, default=20, metavar="N",
                      help="with --spent: at most N payments, newest first (default: %(default)s)")
    mcpp.add_argument("--json", action="store_true", help="with --spent: print one JSON document")
    mcpp.add_argument("--log-level", default="warning", choices=["error", "warning", "info", "debug"],
                      help="log level on stderr (default: %(default)s; info logs each payment)")
    mcpp.set_defaults(func=cmd_mcp)

    devnet = sub.add_parser(
        "devnet", help="run the devnet chains as their own process (gateways use them over RPC)",
        description="Serve the devnet chains (EVM mirroring Base Sepolia, Solana mirroring Solana "
        "devnet; state in memory) on their own, so several production-mode gateways settle on "
        "one chain and the chain outlives a gateway. Routes: GET /devnet, GET /devnet/balance, "
        "POST /devnet/faucet, POST /devnet/evm and /devnet/solana (JSON-RPC), GET /healthz. "
        "Prints the settings a gateway needs; the facilitator keys only go to --env-file.",
        epilog="variables read: none; the options say it all (the PAYWIRE_* settings it prints "
        "are for the gateways that settle on it).")
    devnet.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: %(default)s)")
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
                        help="log level (default: %(default)s; info logs each request)")
    devnet.set_defaults(func=cmd_devnet)

    skills = sub.add_parser("skills", help="check resource files; switch skills off and on")
    skills_sub = skills.add_subparsers(dest="skills_command", required=True)
    check = skills_sub.add_parser(
        "check", help="validate resource files (or folders of them)",
        description="Check resource files as the gateway loads them: every problem of each file, "
        "naming the field. Exit code 0 when all are valid, 1 otherwise.",
        epilog="variables read: none (a file's `env` and `*_env` fields name the variables the "
        "gateway will read for it; `paywire config` shows their values).")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a resource file (*.json), or a folder: its *.json files")
    check.set_defaults(func=cmd_skills_check)
    _add_control_commands(sub, skills_sub)

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
                               help="the database (overrides PAYWIRE_DATABASE_URL; default: the "
                               "SQLite file paywire.db in the data folder)")
        db_parser.add_argument("--data-dir", metavar="DIR",
                               help="folder of the default SQLite database (overrides "
                               f"PAYWIRE_DATA_DIR; default: {_default('PAYWIRE_DATA_DIR')})")
    db_upgrade.set_defaults(func=cmd_db_upgrade)
    db_current.set_defaults(func=cmd_db_current)

    ledger = sub.add_parser(
        "ledger", help="the payments: by state, stuck ones, the reconciler; revenue and exports",
        description="What the payment ledger holds. With no option: payments and amounts by state, "
        "then the unfinished ones (claimed, settling, pending), oldest first, marked STUCK once "
        "their lease ran out and the reconciler has not settled them yet. `paywire ledger revenue`: "
        "revenue, upstream cost and margin by skill, network and day; `paywire ledger payments`: "
        "the payments, filtered, as a table, CSV or JSON (`COMMAND --help` for their options). "
        "Reads only.",
        epilog=DB_VARIABLES)
    ledger.add_argument("--state", choices=[s.value for s in _payment_states()],
                        help="list the latest payments in this state instead (default: the counts)")
    ledger.add_argument("--events", action="store_true",
                        help="list what the reconciler did (settled or released a payment), newest first")
    ledger.add_argument("--limit", type=int, default=50, metavar="N",
                        help="at most N payments or events (default: %(default)s)")
    ledger.add_argument("--json", action="store_true", help="print JSON instead of text")
    ledger.add_argument("--database-url", metavar="URL",
                        help="the database (default: PAYWIRE_DATABASE_URL, else the SQLite file "
                        "paywire.db in the data folder)")
    ledger.add_argument("--data-dir", metavar="DIR",
                        help="folder of the default SQLite database (default: PAYWIRE_DATA_DIR, "
                        f"else {_default('PAYWIRE_DATA_DIR')})")
    ledger.set_defaults(func=cmd_ledger)
    _ledger_export_parsers(ledger)
    return parser


def _payment_states() -> list[Any]:
    from payments.ledger_schema import PaymentState

    return list(PaymentState)


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
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
