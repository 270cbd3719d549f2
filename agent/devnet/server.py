"""`paywire devnet`: the devnet chains as their own process, which gateways use over JSON-RPC.

Inside `paywire serve` (devnet mode) the chains live and die with the gateway. Served on their
own, like a real node, several gateway replicas settle on one chain, and the chain (and what
was paid on it) survives a gateway's crash. A gateway uses it in production mode: the
in-process facilitator (the SDK's signers) over `/devnet/evm` and `/devnet/solana`, paying to
the devnet's merchant addresses. `gateway_env` is that configuration; its facilitator keys are
written only to an owner-only env file, never printed or logged.

The chains mirror Base Sepolia and Solana devnet at their real USDC addresses (DevUSDC at the
Base Sepolia USDC address, the devnet USDC mint), so a production gateway's quotes for
`base-sepolia,solana-devnet` name the devnet's tokens without any asset setting. The Solana
merchant's key is in the env file too (`PAYWIRE_REFUND_KEY_SOLANA`): a gateway sends the Solana
refunds from it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent import hygiene
from agent.devnet.http import routes as devnet_routes
from agent.edge.http_io import edge_error
from agent.serving import STARTUP_FAILURE, CannotListen, Server, listen, uvicorn_config
from payments.devnet import Devnet, DevnetNotInstalled, check_installed
from payments.devnet.keys import KEYS_FILE, load_or_create_keys

# What a production-mode gateway needs and nobody else may read: written to the env file only.
SECRET_VARIABLES = ("PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_SOLANA_FACILITATOR_KEY",
                    "PAYWIRE_REFUND_KEY_SOLANA")
_WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def gateway_env(devnet: Devnet, base_url: str) -> dict[str, str]:
    """The settings of a production-mode `paywire serve` that settles on this devnet."""
    keys = devnet.keys
    return {
        "PAYWIRE_NETWORKS": ",".join(n.v1_name for n in devnet.networks),
        "PAYWIRE_EVM_RPC_URL": f"{base_url}/devnet/evm",
        "PAYWIRE_SOLANA_RPC_URL": f"{base_url}/devnet/solana",
        "PAYWIRE_EVM_PAY_TO": keys.evm_merchant_address,
        "PAYWIRE_SOLANA_PAY_TO": keys.sol_merchant_address,
        # The accounts the devnet funds for gas and fees at genesis.
        "PAYWIRE_EVM_FACILITATOR_KEY": keys.evm_facilitator,
        "PAYWIRE_SOLANA_FACILITATOR_KEY": keys.sol_fee_payer,
        # The Solana merchant's own key: refunds are sent from the wallet payments go to (the
        # devnet gives it SOL for their fees).
        "PAYWIRE_REFUND_KEY_SOLANA": keys.sol_merchant,
    }


def write_env_file(path: Path, env: dict[str, str], base_url: str) -> None:
    """`KEY=value` lines (for `set -a; . FILE` and `docker --env-file`), mode 0600 from the
    start: written to a private temporary file, then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# paywire devnet at {base_url}: a production-mode `paywire serve` settles on it "
             "with these settings.", "# Holds facilitator and refund keys: keep it private.",
             *(f"{name}={value}" for name, value in env.items())]
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {404: f"no route {request.url.path}; GET /devnet lists the chains",
               405: f"{request.method} is not allowed on {request.url.path}"
               }.get(exc.status_code, str(exc.detail))
    return edge_error(request.url.path, exc.status_code, code, message)


async def _server_error(request: Request, exc: Exception) -> Response:
    return edge_error(request.url.path, 500, "internal_error", f"internal error ({type(exc).__name__})")


def create_devnet_app(devnet: Devnet, base_url: str) -> Starlette:
    """The devnet's routes (agent/devnet/http.py) and `GET /healthz`, on an app of their own."""

    async def healthz(request: Request) -> Response:
        """Liveness and readiness at once: the chains are built before the app serves."""
        return JSONResponse({"status": "ok", "networks": [n.caip2 for n in devnet.networks]})

    app = Starlette(
        routes=[Route("/healthz", healthz, methods=["GET"]), *devnet_routes(devnet, base_url)],
        exception_handlers={HTTPException: _http_exception, Exception: _server_error})
    hygiene.apply()  # py-evm and py_ecc raise the recursion limit on import
    return app


def _url_host(host: str) -> str:
    host = _WILDCARD_HOSTS.get(host, host)
    return f"[{host}]" if ":" in host else host


def _summary(env: dict[str, str], devnet: Devnet, base_url: str, data_dir: Path,
             env_file: Path | None) -> str:
    keys = devnet.keys
    secrets = ", ".join(SECRET_VARIABLES)
    lines = [
        f"paywire devnet: EVM (Base Sepolia mirror, chain {devnet.evm.CHAIN_ID}) and Solana "
        f"(devnet mirror) at {base_url}",
        f"  chain state is in this process's memory; keys in {data_dir / KEYS_FILE}",
        "  a production-mode gateway (`paywire serve`) settles on it with:",
        *(f"    {name}={value}" for name, value in env.items() if name not in SECRET_VARIABLES),
    ]
    if env_file is not None:
        lines += [f"    {secrets}: in the env file",
                  f"  env file (mode 0600): {env_file}",
                  f"    set -a; . {env_file}; set +a; paywire serve"]
    else:
        lines.append(f"    {secrets}: not printed; pass --env-file PATH to have every setting "
                     "written there (mode 0600)")
    lines += [f"  demo payer (100 USDC on each chain, used by `paywire pay`): "
              f"{keys.evm_payer_address} (EVM), {keys.sol_payer_address} (Solana)",
              f"  faucet: POST {base_url}/devnet/faucet "
              "{\"network\", \"address\", \"amount\", \"eth_wei\"?}"]
    return "\n".join(lines)


def run(*, host: str, port: int, data_dir: Path, env_file: Path | None, public_url: str | None,
        log_level: str) -> int:
    """Build both chains, listen, announce the gateway settings, serve until stopped."""
    try:
        check_installed()  # before any key is written
    except DevnetNotInstalled as exc:
        print(f"paywire devnet: {exc}", file=sys.stderr)
        return 2
    hygiene.configure_logging(log_level)
    try:  # with port 0 the system picks a free one, and the URLs name it
        sock = listen(host, port, port_setting="--port (0 picks a free one)")
    except CannotListen as exc:
        print(f"paywire devnet: {exc}", file=sys.stderr)
        return STARTUP_FAILURE
    base_url = (public_url or f"http://{_url_host(host)}:{sock.getsockname()[1]}").rstrip("/")
    devnet = Devnet(load_or_create_keys(data_dir))
    app = create_devnet_app(devnet, base_url)
    env = gateway_env(devnet, base_url)
    if env_file is not None:
        env_file = env_file.resolve()
        write_env_file(env_file, env, base_url)
    print(_summary(env, devnet, base_url, data_dir, env_file), flush=True)
    server = Server(uvicorn_config(app, host=host, port=sock.getsockname()[1], log_level=log_level))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0 if server.started else STARTUP_FAILURE
