"""`paywire skills check | disable | enable | disabled`: check resource files; switch skills off
and on for every gateway sharing the database."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.cli.common import Commands
from agent.cli.controls import CONTROLS_VARIABLES, controls_command, controls_options, operator


def register(commands: Commands) -> None:
    skills = commands.add_parser("skills", help="check resource files; switch skills off and on")
    skills_sub = skills.add_subparsers(dest="skills_command", required=True)
    check = skills_sub.add_parser(
        "check", help="validate resource files (or folders of them)",
        description="Check resource files as the gateway loads them: every problem of each file, "
        "naming the field. Exit code 0 when all are valid, 1 otherwise.",
        epilog="variables read: none (a file's `env` and `*_env` fields name the variables the "
        "gateway will read for it; `paywire config` shows their values).")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="a resource file (*.json), or a folder: its *.json files")
    check.set_defaults(func=check_files)

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
        controls_options(parser)
        parser.set_defaults(func=switch)
    controls_options(disabled)
    disabled.set_defaults(func=list_disabled)


def check_files(args: argparse.Namespace) -> int:
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


def switch(args: argparse.Namespace) -> int:
    enabled = args.skills_command == "enable"

    async def work(controls: Any) -> str:
        await controls.set_skill(args.skill_id, enabled=enabled, reason=args.reason,
                                 changed_by=operator())
        return (f"{args.skill_id}: switched on" if enabled else
                f"{args.skill_id}: switched off (calls answer 503 before any quote)")

    return controls_command(args, f"paywire skills {args.skills_command}", work,
                            skill_id=None if enabled else args.skill_id)


def list_disabled(args: argparse.Namespace) -> int:
    async def work(controls: Any) -> str:
        found = await controls.disabled_skills()
        return "\n".join(f"{s.skill_id}\t{s.changed_at:%Y-%m-%d %H:%M:%S}\t{s.changed_by}\t"
                         f"{s.reason or ''}" for s in found) or "no skill is switched off"

    return controls_command(args, "paywire skills disabled", work)
