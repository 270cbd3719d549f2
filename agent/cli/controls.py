"""What the operator's control commands share (`paywire skills disable | enable | disabled`,
`paywire payers deny | allow | list`): payments/controls.py on the database the gateways share."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent.cli.common import CONFIG_ERROR, CommandFailed, config_error
from agent.cli.database import database_command, database_options
from agent.settings import ConfigError, Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

CONTROLS_VARIABLES = (
    "variables read: PAYWIRE_DATABASE_URL (the database the gateways share; a SQLAlchemy URL with an "
    "async driver; default: the SQLite file paywire.db in PAYWIRE_DATA_DIR), PAYWIRE_DATA_DIR "
    "(default .paywire); for skill ids, the settings that decide what is sold (PAYWIRE_RESOURCE_DIRS, "
    "PAYWIRE_MODELS_FILE...), as `paywire serve` reads them. Running gateways follow a change within "
    "PAYWIRE_CONTROLS_REFRESH_SECONDS (default 2). The operator API (/admin) does the same over HTTP. "
    f"A configuration problem is one line on stderr and exit code {CONFIG_ERROR}; a database that "
    "cannot be reached, one line and exit code 1.")


def controls_options(parser: argparse.ArgumentParser) -> None:
    database_options(parser, "the database the gateways share (default: PAYWIRE_DATABASE_URL, "
                     "else the SQLite file paywire.db in the data folder)")


def controls_command(args: argparse.Namespace, command: str,
                     work: Callable[[Any], Awaitable[str]], *, skill_id: str | None = None) -> int:
    """`work(controls)` on the configured database (schema current); prints what it returns.
    `skill_id`: one these settings must sell."""
    from payments.controls import ControlError, Controls
    from payments.schema import ensure_current

    async def run(engine: AsyncEngine) -> str:
        await ensure_current(engine)
        return await work(Controls(engine))

    def sold(settings: Settings) -> None:
        if skill_id is not None and skill_id not in _sold_skill_ids(settings):
            raise ConfigError(f"no skill named {skill_id!r} is sold with these settings; "
                              "GET /api/marketplace/apis and /v1/models list the ids")

    try:
        _, said = database_command(command, args, run, check=sold)
    except ControlError as exc:
        raise CommandFailed(config_error(ConfigError(exc.message), command)) from None
    print(said)
    return 0


def _sold_skill_ids(settings: Settings) -> set[str]:
    """The ids the gateway would sell with these settings (resources, models, help)."""
    from agent.app import build_registry
    from skills.help import HELP_SKILL
    from skills.models.upstream import UpstreamClient

    return {s.id for s in build_registry(settings, UpstreamClient()).all()} | {HELP_SKILL}


def operator() -> str:
    """Who changed a switch: this CLI, its user and host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"paywire CLI ({user}@{socket.gethostname()})"
