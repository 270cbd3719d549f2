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
MAX_FAUCET_WEI = 10 * 10**18  # 10 ETH of gas per faucet call (a settlement costs ~1e-4 ETH here)


def _err(message: str, param: str, status: int = 400) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param,
                   "code": "invalid_parameter"}}, status)


def _whole(value: Any, most: int) -> bool:
    """A JSON whole number in 0..most (not a bool, which JSON decoding makes an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


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
        """Mint test USDC, and on EVM send ETH for gas when `eth_wei` asks for it.

        `amount` 0 mints nothing on EVM; on Solana it opens the address's USDC account (every
        Solana call also airdrops 1 SOL), which a pay-to address needs before it is paid."""
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
        if not _whole(amount, MAX_FAUCET_ATOMIC):
            return _err(f"'amount' must be a whole number of atomic units, 0..{MAX_FAUCET_ATOMIC}",
                        "amount")
        eth_wei = body.get("eth_wei", 0)
        if not _whole(eth_wei, MAX_FAUCET_WEI):
            return _err(f"'eth_wei' must be a whole number of wei, 0..{MAX_FAUCET_WEI} (10 ETH)",
                        "eth_wei")
        if eth_wei and network.family != "evm":
            return _err("'eth_wei' is for EVM networks; on Solana every faucet call airdrops 1 SOL",
                        "eth_wei")
        if network.family == "evm" and not (amount or eth_wei):
            return _err("nothing to send: give 'amount' (USDC) or 'eth_wei' (gas) above 0",
                        "amount")
        address = str(body.get("address", ""))
        try:
            tx = (await asyncio.to_thread(devnet.fund, address, amount, network)
                  if amount or network.family != "evm" else None)
            gas_tx = await asyncio.to_thread(devnet.fund_gas, address, eth_wei) if eth_wei else None
        except ValueError as exc:
            return _err(f"not an address on {network.v1_name}: {exc}", "address")
        answer: dict[str, Any] = {"network": network.caip2, "address": address, "amount": amount,
                                  "transaction": tx}
        if eth_wei:
            answer.update(eth_wei=eth_wei, gas_transaction=gas_tx)
        return JSONResponse(answer)

    return [
        Route("/devnet", info, methods=["GET"]),
        Route("/devnet/balance", balance, methods=["GET"]),
        Route("/devnet/faucet", faucet, methods=["POST"]),
        Route("/devnet/evm", rpc_endpoint(devnet.evm.rpc), methods=["POST"]),
        Route("/devnet/solana", rpc_endpoint(devnet.solana.rpc), methods=["POST"]),
    ]
