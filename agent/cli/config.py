"""`paywire config`: the effective configuration, secrets masked; the variables resource files
declare too."""

from __future__ import annotations

import argparse

from agent.cli.common import CONFIG_ERROR, Commands, config_error, serve_settings, setting_default
from agent.settings import ConfigError, looks_secret
from agent.version import VERSION


def register(commands: Commands) -> None:
    config = commands.add_parser(
        "config", help="print the effective configuration (secrets masked)",
        description="Print every setting's effective value (secrets masked) and "
        "where it comes from, and the variables resource files declare. Exits "
        f"{CONFIG_ERROR} with the message `paywire serve` would stop with.",
        epilog="variables read: every setting `paywire serve --help` lists "
        "(PAYWIRE_*, the model providers' keys and base URLs), and the variables "
        "resource files declare (their `env` and `*_env` fields, e.g. "
        "NANSEN_API_KEY).")
    config.add_argument("--host", help="as `paywire serve --host` (default: PAYWIRE_HOST, else "
                        f"{setting_default('PAYWIRE_HOST')})")
    config.add_argument("--port", type=int, help="as `paywire serve --port` (default: PAYWIRE_PORT, "
                        f"else {setting_default('PAYWIRE_PORT')})")
    config.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exits 2 with the one-line message `paywire serve` would stop with."""
    from skills.resource_files import (
        BUILTIN_DIR,
        ResourceFileError,
        check_resource_dirs,
        declared_variables,
        read_resource_file,
    )

    try:
        settings = serve_settings(args)
        problems = check_resource_dirs(settings.resource_dirs)
        if problems:
            raise ConfigError.of([f"PAYWIRE_RESOURCE_DIRS: {p}" for p in problems])
    except ConfigError as exc:
        return config_error(exc)
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
