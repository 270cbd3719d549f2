"""HTTP face of the local devnet: chain JSON-RPC for real clients, balances, and a faucet.

Served only when paywire runs on its devnet. `/devnet/evm` and `/devnet/solana` speak the
chains' standard JSON-RPC, so web3.py, solana-py, the x402 SDK clients and `paywire pay` use the
devnet exactly as they would use a public node.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.edge.http_io import BodyTooLarge, InvalidJson, read_json
from payments.devnet import Devnet, jsonrpc
from payments.networks import lookup_network

MAX_RPC_BYTES = 256 * 1024
MAX_RPC_BATCH = jsonrpc.MAX_BATCH  # calls in one JSON-RPC batch
MAX_FAUCET_ATOMIC = 1_000_000_000  # 1,000 USDC per faucet call


def _err(message: str, param: str, status: int = 400) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param,
                   "code": "invalid_parameter"}}, status)


def routes(devnet: Devnet, base_url: str) -> list[Route]:
    def rpc_endpoint(rpc: jsonrpc.Rpc) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                body = await read_json(request, MAX_RPC_BYTES)
            except BodyTooLarge:
                reply = jsonrpc.refusal(413, jsonrpc.INVALID_REQUEST,
                                        f"request larger than {MAX_RPC_BYTES} bytes")
            except InvalidJson as exc:
                reply = jsonrpc.refusal(400, jsonrpc.PARSE_ERROR, f"parse error: {exc.message}")
            else:
                reply = await asyncio.to_thread(jsonrpc.answer, body, rpc, max_batch=MAX_RPC_BATCH)
            return JSONResponse(reply.body, reply.status)

        return endpoint

    async def info(request: Request) -> Response:
        keys = devnet.keys
        merchant = await asyncio.to_thread(devnet.merchant_balances)
        payer_evm = await asyncio.to_thread(devnet.evm.balance_of, keys.evm_payer_address)
        payer_sol = await asyncio.to_thread(devnet.solana.token_balance, keys.sol_payer_address)
        return JSONResponse({
            "devnet": True,
            "warning": "payments settle on a local test chain inside this process; "
                       "devnet USDC has no value",
            "networks": {
                "evm": {"network": devnet.evm.NETWORK, "chain_id": devnet.evm.CHAIN_ID,
                        "usdc": devnet.evm.USDC_ADDRESS, "rpc_url": f"{base_url}/devnet/evm",
                        "merchant": keys.evm_merchant_address, "merchant_balance": merchant.evm,
                        "demo_payer": keys.evm_payer_address, "demo_payer_balance": payer_evm},
                "solana": {"network": devnet.solana.NETWORK, "usdc": devnet.solana.USDC_MINT,
                           "rpc_url": f"{base_url}/devnet/solana",
                           "merchant": keys.sol_merchant_address,
                           "merchant_balance": merchant.solana,
                           "demo_payer": keys.sol_payer_address,
                           "demo_payer_balance": payer_sol},
            },
        })

    async def balance(request: Request) -> Response:
        address = request.query_params.get("address", "")
        try:
            network = lookup_network(request.query_params.get("network", ""))
        except ValueError as exc:
            return _err(str(exc), "network")
        if not address:
            return _err("query parameter 'address' is required", "address")
        try:
            amount = await asyncio.to_thread(devnet.balance, address, network)
        except ValueError as exc:
            return _err(f"not an address on {network.v1_name}: {exc}", "address")
        return JSONResponse({"network": network.caip2, "address": address, "balance": amount})

    async def faucet(request: Request) -> Response:
        try:
            body = await read_json(request, 4096, empty={})
        except (BodyTooLarge, InvalidJson):
            return _err("body must be a small JSON object {network, address, amount}", "body")
        if not isinstance(body, dict):
            return _err("body must be a JSON object {network, address, amount}", "body")
        try:
            network = lookup_network(str(body.get("network", "")))
        except ValueError as exc:
            return _err(str(exc), "network")
        if network not in devnet.networks:
            return _err(f"this devnet runs {[n.v1_name for n in devnet.networks]}", "network")
        amount = body.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or not (
            0 < amount <= MAX_FAUCET_ATOMIC
        ):
            return _err(f"'amount' must be a whole number of atomic units, 1..{MAX_FAUCET_ATOMIC}",
                        "amount")
        address = str(body.get("address", ""))
        try:
            tx = await asyncio.to_thread(devnet.fund, address, amount, network)
        except ValueError as exc:
            return _err(f"not an address on {network.v1_name}: {exc}", "address")
        return JSONResponse({"network": network.caip2, "address": address, "amount": amount,
                             "transaction": tx})

    return [
        Route("/devnet", info, methods=["GET"]),
        Route("/devnet/balance", balance, methods=["GET"]),
        Route("/devnet/faucet", faucet, methods=["POST"]),
        Route("/devnet/evm", rpc_endpoint(devnet.evm.rpc), methods=["POST"]),
        Route("/devnet/solana", rpc_endpoint(devnet.solana.rpc), methods=["POST"]),
    ]
