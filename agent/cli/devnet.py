"""`paywire devnet`: the devnet chains as their own process (agent/devnet/server.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.common import Commands, config_error
from agent.settings import ConfigError, PayerSettings

DEVNET_PORT = 8100  # `paywire devnet`, beside the gateway's 8000


def register(commands: Commands) -> None:
    devnet = commands.add_parser(
        "devnet", help="run the devnet chains as their own process (gateways use them over RPC)",
        description="Serve the devnet chains (EVM mirroring Base Sepolia, Solana mirroring Solana "
        "devnet; state in memory) on their own, so several production-mode gateways settle on "
        "one chain and the chain outlives a gateway. Routes: GET /devnet, GET /devnet/balance, "
        "POST /devnet/faucet, POST /devnet/evm and /devnet/solana (JSON-RPC), GET /healthz. "
        "Prints the settings a gateway needs; the facilitator keys only go to --env-file.",
        epilog="variables read: PAYWIRE_DATA_DIR (default .paywire), the folder of the devnet keys "
        "unless --data-dir names one (as `paywire serve` and `paywire pay` read it); the PAYWIRE_* "
        "settings it prints are for the gateways that settle on it.")
    devnet.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: %(default)s)")
    devnet.add_argument("--port", type=int, default=DEVNET_PORT,
                        help=f"port to listen on (default: {DEVNET_PORT}; 0 picks a free one, "
                        "named in the printed URLs and the env file)")
    devnet.add_argument("--data-dir", type=Path,
                        help="folder of the devnet keys, created on first start (default: "
                        "PAYWIRE_DATA_DIR, else .paywire, where `paywire pay` finds the demo payer)")
    devnet.add_argument("--env-file", type=Path,
                        help="write the production-mode gateway settings here, facilitator keys "
                        "included (mode 0600; `set -a; . FILE; set +a` before `paywire serve`)")
    devnet.add_argument("--public-url",
                        help="base URL gateways reach the devnet at, used in the RPC URLs "
                        "(default: http://HOST:PORT)")
    devnet.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="log level (default: %(default)s; info logs each request)")
    devnet.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:  # the folder `paywire pay` reads the demo payer from: the same variable, read alike
        data_dir = args.data_dir or PayerSettings.from_env().data_dir
    except ConfigError as exc:
        return config_error(exc, "paywire devnet")
    from agent.devnet.server import run as serve_devnet

    return serve_devnet(host=args.host, port=args.port, data_dir=data_dir, env_file=args.env_file,
                        public_url=args.public_url, log_level=args.log_level)
