"""The `paywire` command: serve the gateway, pay for a call, check a resource file."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from urllib.parse import urlsplit

from .settings import ConfigError, Settings


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
    env = dict(os.environ)
    if args.host:
        env["PAYWIRE_HOST"] = args.host
    if args.port:
        env["PAYWIRE_PORT"] = str(args.port)
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:
        print(f"paywire: configuration error: {exc}", file=sys.stderr)
        return 2
    devnet = None
    if settings.devnet:
        from payments.devnet import Devnet, DevnetNotInstalled, check_installed
        from payments.devnet.keys import load_or_create_keys

        try:
            check_installed()  # before any key is written
            devnet = Devnet(load_or_create_keys(settings.data_dir))
        except DevnetNotInstalled as exc:  # a production install (`pip install .`) on devnet settings
            print(f"paywire: {exc}", file=sys.stderr)
            return 2
        print(_banner(settings, devnet), file=sys.stderr, flush=True)
    from .app import create_app
    from .hygiene import configure_logging
    from .serving import serve

    configure_logging(args.log_level)

    try:
        app = create_app(settings, devnet=devnet)
    except ConfigError as exc:
        print(f"paywire: configuration error: {exc}", file=sys.stderr)
        return 2
    serve(app, host=settings.host, port=settings.port, log_level=args.log_level,
          header_timeout=settings.header_timeout_seconds, body_timeout=settings.body_timeout_seconds)
    return 0


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
    secret = os.environ.get("PAYWIRE_PAYER_KEY", "").strip()
    solana_rpc = args.solana_rpc or os.environ.get("PAYWIRE_SOLANA_RPC_URL") or None
    try:
        if secret:
            keys = PayerKeys.from_secret(secret)
        else:
            demo = _demo_keys(Path(os.environ.get("PAYWIRE_DATA_DIR", ".paywire")))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paywire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (devnet unless configured)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="log level (default: info; info and below log each request)")
    serve.set_defaults(func=cmd_serve)

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

    skills = sub.add_parser("skills", help="skill authoring tools")
    skills_sub = skills.add_subparsers(dest="skills_command", required=True)
    check = skills_sub.add_parser("check", help="validate resource files (or folders of them)")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=cmd_skills_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
