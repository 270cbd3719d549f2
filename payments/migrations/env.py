"""Alembic's environment for the ledger's tables.

Two ways in:
- `payments.schema` (what `paywire db upgrade`, the gateway's startup and the tests use) opens
  the transaction on the app's own async engine and hands the connection in
  `config.attributes["connection"]` (run through `AsyncConnection.run_sync`);
- the `alembic` command, for writing a new revision (`alembic -c payments/migrations/alembic.ini
  revision --autogenerate -m ...`): the URL comes from `-x url=...` or PAYWIRE_DATABASE_URL, an
  async one (sqlite+aiosqlite, postgresql+asyncpg) like the gateway's.

No logging is configured here (no `fileConfig`): the gateway's logging stays as it set it up.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from payments.ledger_schema import metadata
from payments.schema import VERSION_TABLE, include_name

config = context.config


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        # SQLite alters a column's type or adds a constraint by copying the table ("batch").
        render_as_batch=True,
        compare_type=True,
        # Only the paywire_* tables are ours: the a2a SDK's `tasks` lives in the same database
        # and is created by its DatabaseTaskStore, not by these migrations.
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_on_url(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(run_migrations)
    finally:
        await engine.dispose()


def database_url() -> str:
    url = (context.get_x_argument(as_dictionary=True).get("url")
           or os.environ.get("PAYWIRE_DATABASE_URL") or config.get_main_option("sqlalchemy.url"))
    if not url:
        raise SystemExit("alembic: give the database: -x url=sqlite+aiosqlite:///path/paywire.db "
                         "or PAYWIRE_DATABASE_URL")
    return url


if context.is_offline_mode():
    raise SystemExit("alembic: offline mode (--sql) is not supported; run `paywire db upgrade`")
given = config.attributes.get("connection")
if given is not None:
    run_migrations(given)
else:
    asyncio.run(run_on_url(database_url()))
