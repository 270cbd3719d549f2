"""The payer's side of Permit2 (x402 `upto` on EVM): its USDC allowance for Permit2, read from the
chain, and the one-time `approve` that gives it.

`upto` moves USDC through Permit2 (0x000000000022D473030F116dDEE9F6B43aC78BA3), which can take
only what the payer approved it for. A payer without that approval cannot pay `upto` (the
facilitator refuses it), so the client reads the allowance before it signs (bounded in time, like
its other reads) and, without one, pays `exact` instead (payments/payer.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS

from wire import wire_json

from .client_limits import DEFAULT_LIMITS, NO_COMPRESSION, AnswerTooLarge, read_bounded

READ_SECONDS = 5.0  # an allowance read: the node answers at once or not at all
APPROVE_SECONDS = 120.0  # the approve transaction, sent and mined
_ALLOWANCE = "0xdd62ed3e"  # allowance(address,address)
# Known public nodes, for a payer who names none (a devnet announces its own at /devnet).
PUBLIC_RPC = {"eip155:8453": "https://mainnet.base.org", "eip155:84532": "https://sepolia.base.org"}
UNLIMITED = 2**256 - 1


class ChainUnread(Exception):
    """The node could not be asked; the message says which and why."""


def _word(address: str) -> str:
    return address.lower().removeprefix("0x").rjust(64, "0")


async def permit2_allowance(rpc_url: str, token: str, owner: str) -> int:
    """`token.allowance(owner, Permit2)` at the latest block; ChainUnread when the node does not
    answer within READ_SECONDS or answers no number."""
    call = {"to": token, "data": _ALLOWANCE + _word(owner) + _word(PERMIT2_ADDRESS)}
    request = {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": [call, "latest"]}
    try:
        async with httpx.AsyncClient(timeout=READ_SECONDS) as http, asyncio.timeout(READ_SECONDS):
            async with http.stream("POST", rpc_url, json=request, headers=NO_COMPRESSION) as answer:
                reply = wire_json.loads(await read_bounded(answer, DEFAULT_LIMITS.quote_bytes))
        return int(str(reply["result"]), 16)
    except (httpx.HTTPError, AnswerTooLarge, TimeoutError) as exc:
        raise ChainUnread(f"the EVM node {rpc_url} did not answer ({type(exc).__name__})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ChainUnread(f"the EVM node {rpc_url} gave no allowance ({type(exc).__name__})") from None


def approve_permit2(rpc_url: str, private_key: str, token: str) -> str:
    """Send `token.approve(Permit2, unlimited)` from the key's account, its gas paid by that
    account, and wait for it to be mined (at most APPROVE_SECONDS); the transaction hash.
    Blocking (web3): run it in a thread from async code. ValueError when it reverts."""
    from eth_account import Account
    from web3 import Web3

    account = Account.from_key(private_key)
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": READ_SECONDS}))
    data = "0x095ea7b3" + _word(PERMIT2_ADDRESS) + hex(UNLIMITED)[2:]
    tx: dict[str, Any] = {"from": account.address, "to": Web3.to_checksum_address(token),
                          "data": data, "chainId": w3.eth.chain_id, "value": 0,
                          "nonce": w3.eth.get_transaction_count(account.address, "pending")}
    base_fee = int(w3.eth.get_block("latest").get("baseFeePerGas", 0))
    tip = int(w3.eth.max_priority_fee) if base_fee else 0
    tx |= {"maxFeePerGas": 2 * base_fee + tip, "maxPriorityFeePerGas": tip}
    tx["gas"] = w3.eth.estimate_gas(tx)  # type: ignore[arg-type]
    sent = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(sent, timeout=APPROVE_SECONDS, poll_latency=0.2)
    if receipt["status"] != 1:
        raise ValueError(f"the approve transaction {sent.hex()} reverted")
    return "0x" + sent.hex().removeprefix("0x")
