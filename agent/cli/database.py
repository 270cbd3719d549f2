"""The commands' way to the database (`paywire serve`'s schema check, db, ledger, skills switches,
payers): the settings that name it, one event loop per command, and every problem as one line
(a configuration problem exit code 2; a database that cannot be reached or refuses, exit code 1)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent.cli.common import CONFIG_ERROR, CommandFailed, config_error, setting_default
from agent.settings import ConfigError, Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

DB_VARIABLES = ("variables read: PAYWIRE_DATABASE_URL (a SQLAlchemy URL with an async driver, e.g. "
                "postgresql+asyncpg://user:pass@host/db; default: the SQLite file paywire.db in "
                "PAYWIRE_DATA_DIR), PAYWIRE_DATA_DIR (default .paywire). The other settings of "
                "`paywire serve --help` are checked as `paywire serve` checks them. A configuration "
                f"problem is one line on stderr and exit code {CONFIG_ERROR}; a database that cannot "
                "be reached or refuses a statement, one line and exit code 1.")


class DatabaseUnusable(Exception):
    """The database could not be reached, or refused a statement: one line, never a traceback."""


def database_options(parser: argparse.ArgumentParser, database_help: str, *,
                     data_dir_help: str | None = None, suppress: bool = False) -> None:
    """--database-url and --data-dir, the options every database command takes. `suppress`: a
    subcommand's, so that the value given before it (`paywire ledger --data-dir D revenue`) stays."""
    default = {"default": argparse.SUPPRESS} if suppress else {}
    parser.add_argument("--database-url", metavar="URL", help=database_help, **default)
    parser.add_argument("--data-dir", metavar="DIR", **default, help=data_dir_help or (
        "folder of the default SQLite database (default: PAYWIRE_DATA_DIR, "
        f"else {setting_default('PAYWIRE_DATA_DIR')})"))


def db_settings(args: argparse.Namespace) -> Settings:
    """The settings, --database-url and --data-dir in place of their variables."""
    env = dict(os.environ)
    if getattr(args, "database_url", None):
        env["PAYWIRE_DATABASE_URL"] = args.database_url
        env.pop("PAYWIRE_DATABASE_URL_FILE", None)  # the option wins over both forms
    if getattr(args, "data_dir", None):
        env["PAYWIRE_DATA_DIR"] = args.data_dir
    return Settings.from_env(env)


def db_where(settings: Settings) -> str:
    """The variable that names the database, and the database (password hidden)."""
    from sqlalchemy.engine import make_url

    if settings.database_url:
        return f"PAYWIRE_DATABASE_URL {make_url(settings.database_url).render_as_string(hide_password=True)}"
    return f"PAYWIRE_DATA_DIR {settings.data_dir} (SQLite file {make_url(settings.db_url).database})"


def on_database(settings: Settings, work: Callable[[AsyncEngine], Awaitable[T]], *,
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
        try:  # a connection first (the pool keeps it for `work`): its failure has a fix to name
            async with engine.connect():
                pass
        except (DBAPIError, OSError) as exc:
            raise DatabaseUnusable(f"{db_where(settings)}: cannot connect: {_cause(exc)}; "
                                   f"{_connection_fix(url)}") from None
        return await work(engine)
    except (DBAPIError, OSError) as exc:
        raise DatabaseUnusable(f"{db_where(settings)}: {_cause(exc)}") from None
    finally:
        await engine.dispose()


def _cause(exc: Exception) -> str:
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {cause}"


def _connection_fix(url: URL) -> str:
    """What to check when a database cannot be connected to, and the setting that names it."""
    if url.get_backend_name() == "sqlite":
        return (f"check that the folder of {url.database} can be written (PAYWIRE_DATA_DIR), or "
                "name another database with PAYWIRE_DATABASE_URL")
    if url.get_backend_name() == "postgresql":
        return (f"check that the PostgreSQL server is running and accepts connections at "
                f"{url.host or 'localhost'}:{url.port or 5432}, and that the user, password and "
                "database name are right (PAYWIRE_DATABASE_URL: "
                "postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE)")
    return ("check that the database server is running and reachable, and the credentials "
            "(PAYWIRE_DATABASE_URL)")


def database_error(exc: DatabaseUnusable, command: str = "paywire") -> int:
    print(f"{command}: database error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 1


def schema_problem(settings: Settings, exc: Exception) -> ConfigError:
    """A schema another paywire left (payments.schema.SchemaError), as a configuration problem."""
    return ConfigError(f"{db_where(settings)}: {exc}")


def database_command(command: str, args: argparse.Namespace,
                     work: Callable[[AsyncEngine], Awaitable[T]], *, create: bool = True,
                     check: Callable[[Settings], None] | None = None) -> tuple[Settings, T | None]:
    """`work(engine)` on the database the options and variables name (`check(settings)` first):
    the settings and what `work` returned (None: `create` is off and there is no SQLite file).
    Every problem is printed as one line and raised as CommandFailed."""
    from payments.schema import SchemaError

    settings: Settings | None = None
    try:
        settings = db_settings(args)
        if check is not None:
            check(settings)
        return settings, on_database(settings, work, create=create)
    except ConfigError as exc:
        raise CommandFailed(config_error(exc, command)) from None
    except SchemaError as exc:  # a newer paywire's schema, or an older one (`paywire db upgrade`)
        assert settings is not None
        raise CommandFailed(config_error(schema_problem(settings, exc), command)) from None
    except DatabaseUnusable as exc:
        raise CommandFailed(database_error(exc, command)) from None
