"""The ledger's schema version: where a database stands, and bringing it to this paywire's.

Alembic owns the schema (`payments/migrations/`); `payments.ledger_schema` is the head's shape.
The gateway refuses to start on a database another version of paywire left (`ensure_current`),
because running on the wrong tables would lose or misread payments; the operator upgrades it on
purpose with `paywire db upgrade` (`upgrade`), ideally after a backup. An empty database is
created at head on first start, so a fresh `paywire serve` just works.

Our tables are the `paywire_*` ones, the version table included (`paywire_alembic_version`, so
an application sharing the database with its own Alembic history is not mistaken for ours).
Anything else in the database is not ours: the a2a SDK's `tasks` (its DatabaseTaskStore creates
it) is left out of the migrations and out of autogenerate's comparisons (`include_name`).
"""

from __future__ import annotations

import logging
import zlib
from functools import cache
from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from .ledger_schema import metadata

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "paywire_alembic_version"
TABLE_PREFIX = "paywire_"
BASELINE = "0001_baseline"  # paywire_payments as `create_all` made it, before migrations
UPGRADE_COMMAND = "paywire db upgrade"

SchemaState = Literal["empty", "current", "outdated", "ahead"]

# PostgreSQL: one migrating process at a time (replicas starting together on an empty database).
_LOCK_KEY = zlib.crc32(b"paywire schema migrations")


class SchemaError(Exception):
    """The database's schema is not the one this paywire runs on."""

    def __init__(self, message: str, current: str | None, head: str) -> None:
        super().__init__(message)
        self.current = current
        self.head = head


class SchemaOutdated(SchemaError):
    """Older than this paywire (or missing): `paywire db upgrade` brings it to head."""


class SchemaAhead(SchemaError):
    """Upgraded by a newer paywire: this one does not know its revision."""


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


def head_revision() -> str:
    """The revision this paywire's code runs on."""
    head = _scripts().get_current_head()
    assert head is not None
    return head


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's filter: only paywire's tables are compared and migrated (the version table is
    Alembic's own bookkeeping)."""
    return type_ != "table" or bool(name and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE)


def alembic_config(connection: Connection) -> Config:
    """An Alembic Config running env.py on this (sync-facing) connection, inside its transaction."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def _state(conn: Connection) -> tuple[SchemaState, str | None]:
    tables = set(inspect(conn).get_table_names())
    heads: tuple[str, ...] = ()
    if VERSION_TABLE in tables:
        heads = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads()
    if not heads:
        return ("outdated", BASELINE) if "paywire_payments" in tables else ("empty", None)
    current = ",".join(sorted(heads))
    if heads == (head_revision(),):
        return "current", current
    return ("outdated" if all(_known(r) for r in heads) else "ahead"), current


def _known(revision: str) -> bool:
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:  # "Can't locate revision": not one of ours
        return False


def _outdated(current: str | None, head: str) -> SchemaOutdated:
    if current is None:
        where = "the database has no paywire tables"
    elif current == BASELINE:
        where = f"the database schema is at revision {BASELINE} (paywire's tables from before migrations)"
    else:
        where = f"the database schema is at revision {current}"
    return SchemaOutdated(f"{where}, this paywire needs revision {head}: run `{UPGRADE_COMMAND}` "
                          "(back up the database first), then start paywire again", current, head)


def _ahead(current: str | None, head: str) -> SchemaAhead:
    return SchemaAhead(f"the database schema is at revision {current}, newer than this paywire's "
                       f"({head}): a newer paywire upgraded it; run that version (or restore the "
                       "database from before the upgrade)", current, head)


def _upgrade(conn: Connection) -> tuple[str | None, str]:
    # One process migrates at a time (replicas, or two gateways on one SQLite file, starting
    # together on an empty database); the others wait, then find it current.
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
    elif conn.dialect.name == "sqlite":
        # The write lock now, and every statement, DDL included, in this one transaction (the
        # driver would otherwise begin one only at the first INSERT or UPDATE).
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    state, current = _state(conn)  # again, under the lock
    head = head_revision()
    if state == "ahead":
        raise _ahead(current, head)
    if state == "empty":
        # A new database gets the head's tables at once (what the migrations build, which the
        # tests check with `alembic check`), rather than every migration run on no rows.
        metadata.create_all(conn)
        MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).stamp(_scripts(), head)
    elif state == "outdated":
        config = alembic_config(conn)
        if current == BASELINE:  # recorded as such (a no-op if it already is)
            command.stamp(config, BASELINE)
        command.upgrade(config, "head")
        log.info("upgraded the database schema from revision %s to %s", current, head)
    return current, head


async def schema_state(engine: AsyncEngine) -> tuple[SchemaState, str | None]:
    """Where the database stands, and its revision (None when empty). A database with
    paywire_payments and no version table is the baseline (outdated, revision 0001_baseline)."""
    async with engine.connect() as conn:
        return await conn.run_sync(_state)


async def upgrade(engine: AsyncEngine) -> tuple[str | None, str]:
    """Bring the database to head (an empty one is created there); returns (from, to) revisions.
    One transaction (a failure changes nothing), one migrating process at a time. Raises
    SchemaAhead on a newer paywire's database."""
    async with engine.begin() as conn:
        return await conn.run_sync(_upgrade)


async def ensure_current(engine: AsyncEngine, *, create_if_empty: bool = True) -> None:
    """The gateway's startup check: pass on a current database, create an empty one at head
    (unless told not to), refuse any other with SchemaOutdated / SchemaAhead, whose message
    names both revisions and what to do."""
    state, current = await schema_state(engine)
    if state == "current":
        return
    head = head_revision()
    if state == "empty" and create_if_empty:
        await upgrade(engine)
        log.info("created the ledger's tables at schema revision %s", head)
        return
    if state == "ahead":
        raise _ahead(current, head)
    raise _outdated(current, head)
