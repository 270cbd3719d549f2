"""paywire's own reads of a channel on its chain (the batch-settlement contract at the SDK's canonical
address): what the store mirrors, never a facilitator's report (x402 #2559)."""

from __future__ import annotations

from eth_utils import keccak
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS

from ..chain_probe import JsonRpc, ProbeError
from .wire import Onchain

_CHANNELS = keccak(text="channels(bytes32)")[:4].hex()
_PENDING_WITHDRAWALS = keccak(text="pendingWithdrawals(bytes32)")[:4].hex()
_REFUND_NONCE = keccak(text="refundNonce(bytes32)")[:4].hex()


async def _view(rpc: JsonRpc, selector: str, channel_id: str, words: int) -> list[int]:
    """One view call of the contract with a bytes32 argument: its first `words` return words."""
    data = "0x" + selector + channel_id.lower().removeprefix("0x").rjust(64, "0")
    answer = await rpc.call("eth_call", [{"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"])
    raw = bytes.fromhex(str(answer).removeprefix("0x"))
    if len(raw) < 32 * words:
        raise ProbeError(f"the batch-settlement contract answered {len(raw)} bytes to a view call "
                         f"(expected {32 * words}): is it deployed at {BATCH_SETTLEMENT_ADDRESS}?")
    return [int.from_bytes(raw[32 * i:32 * (i + 1)], "big") for i in range(words)]


async def read_channel(rpc: JsonRpc, channel_id: str) -> Onchain:
    """The channel as the chain holds it now: balance and totalClaimed (`channels`), a pending
    withdrawal's start (`pendingWithdrawals(id).initiatedAt`, 0: none) and `refundNonce`. A
    channel never funded reads as all zeros. ProbeError when the chain cannot be asked."""
    balance, claimed = await _view(rpc, _CHANNELS, channel_id, 2)
    _, initiated_at = await _view(rpc, _PENDING_WITHDRAWALS, channel_id, 2)
    [nonce] = await _view(rpc, _REFUND_NONCE, channel_id, 1)
    return Onchain(balance, claimed, initiated_at, nonce)
