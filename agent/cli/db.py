"""`paywire db upgrade | current`: the ledger's schema (payments/schema.py, migrations in
payments/migrations/)."""

from __future__ import annotations

import argparse

from agent.cli.common import CONFIG_ERROR, Commands, setting_default
from agent.cli.database import DB_VARIABLES, database_command, database_options, db_where


def register(commands: Commands) -> None:
    db = commands.add_parser("db", help="the database schema: upgrade it, show its revision",
                             description="The ledger's tables are versioned (Alembic revisions "
                             "shipped with paywire). `paywire serve` creates an empty database at "
                             "the current revision and refuses to start on an older one: run "
                             "`paywire db upgrade` (after a backup) when a new paywire says so.",
                             epilog=DB_VARIABLES)
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
        database_options(
            db_parser, "the database (overrides PAYWIRE_DATABASE_URL; default: the SQLite file "
            "paywire.db in the data folder)",
            data_dir_help="folder of the default SQLite database (overrides PAYWIRE_DATA_DIR; "
            f"default: {setting_default('PAYWIRE_DATA_DIR')})")
    db_upgrade.set_defaults(func=upgrade)
    db_current.set_defaults(func=current)


def upgrade(args: argparse.Namespace) -> int:
    from payments.schema import upgrade as upgrade_schema

    settings, revisions = database_command("paywire db upgrade", args, upgrade_schema)
    before, after = revisions  # type: ignore[misc]
    if before is None:
        print(f"created the schema at revision {after}: {db_where(settings)}")
    elif before == after:
        print(f"already at revision {after}, nothing to do: {db_where(settings)}")
    else:
        print(f"upgraded the schema from revision {before} to {after}: {db_where(settings)}")
    return 0


def current(args: argparse.Namespace) -> int:
    from payments.schema import head_revision, schema_state

    settings, found = database_command("paywire db current", args, schema_state, create=False)
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
    print(f"database: {db_where(settings)}")
    return 0 if state == "current" else 1
