"""paywire's own reads of a channel on its chain (the batch-settlement contract at the SDK's canonical
address): what the store mirrors, never a facilitator's report (x402 #2559)."""

from __future__ import annotations

from collections.abc import Sequence

from eth_abi import decode, encode
from eth_utils import keccak
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS
from x402.mechanisms.evm.batch_settlement.facilitator.claim import build_voucher_claim_args
from x402.mechanisms.evm.batch_settlement.types import VoucherClaim
from x402.mechanisms.evm.constants import MULTICALL3_ADDRESS
from x402.mechanisms.evm.multicall import encode_contract_call

from ..chain_probe import JsonRpc, ProbeError, RpcError
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


# -- many channels at once, the receiver's totals, and a claim's dry run (the claimer's reads) ---

_TRY_AGGREGATE = keccak(text="tryAggregate(bool,(address,bytes)[])")[:4]
_RECEIVERS = keccak(text="receivers(address,address)")[:4].hex()
CHANNELS_PER_READ = 100  # three views each: one eth_call stays well under nodes' gas caps


def _view_data(selector: str, channel_id: str) -> bytes:
    return bytes.fromhex(selector + channel_id.lower().removeprefix("0x").rjust(64, "0"))


async def read_channels(rpc: JsonRpc, channel_ids: Sequence[str]) -> dict[str, Onchain]:
    """`read_channel` for many channels, three views each through Multicall3's tryAggregate at
    the SDK's canonical address (CHANNELS_PER_READ channels per eth_call): the chain as it is
    now, by channel id (lower case). ProbeError when the chain cannot be asked or a view failed."""
    ids = list(dict.fromkeys(cid.lower() for cid in channel_ids))
    read: dict[str, Onchain] = {}
    for start in range(0, len(ids), CHANNELS_PER_READ):
        chunk = ids[start:start + CHANNELS_PER_READ]
        calls = [(BATCH_SETTLEMENT_ADDRESS, _view_data(selector, cid))
                 for cid in chunk for selector in (_CHANNELS, _PENDING_WITHDRAWALS, _REFUND_NONCE)]
        data = "0x" + (_TRY_AGGREGATE + encode(["bool", "(address,bytes)[]"], [False, calls])).hex()
        answer = await rpc.call("eth_call", [{"to": MULTICALL3_ADDRESS, "data": data}, "latest"])
        try:
            [results] = decode(["(bool,bytes)[]"], bytes.fromhex(str(answer).removeprefix("0x")))
        except Exception as exc:  # eth_abi raises several types on bytes that are not its answer
            raise ProbeError(f"Multicall3 at {MULTICALL3_ADDRESS} answered what is not a "
                             f"tryAggregate result ({type(exc).__name__}): is it deployed?") from exc
        if len(results) != len(calls):
            raise ProbeError(f"Multicall3 answered {len(results)} results to {len(calls)} calls")
        for i, cid in enumerate(chunk):
            channel, pending, nonce = (_words(results[3 * i + k], cid, n) for k, n in enumerate((2, 2, 1)))
            read[cid] = Onchain(channel[0], channel[1], pending[1], nonce[0])
    return read


def _words(result: tuple[bool, bytes], channel_id: str, words: int) -> list[int]:
    ok, raw = result
    if not ok or len(raw) < 32 * words:
        raise ProbeError(f"a view of channel {channel_id} failed through Multicall3 ({len(raw)} "
                         f"bytes): is the batch-settlement contract at {BATCH_SETTLEMENT_ADDRESS}?")
    return [int.from_bytes(raw[32 * i:32 * (i + 1)], "big") for i in range(words)]


async def read_receiver(rpc: JsonRpc, receiver: str, token: str) -> tuple[int, int]:
    """The receiver's totals for `token` on the contract: (totalClaimed, totalSettled); what a
    sweep (`settle`) would transfer is their difference."""
    data = "0x" + _RECEIVERS + encode(["address", "address"], [receiver, token]).hex()
    answer = await rpc.call("eth_call", [{"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"])
    raw = bytes.fromhex(str(answer).removeprefix("0x"))
    if len(raw) < 64:
        raise ProbeError(f"the batch-settlement contract answered {len(raw)} bytes to receivers()")
    return int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")


async def estimate_claim(rpc: JsonRpc, claims: list[VoucherClaim], signature: str) -> int | str:
    """A dry run of claimWithSignature for `claims` signed by the receiver-authorizer
    (eth_estimateGas: no gas paid, nothing sent): the gas it takes, or, when the contract refuses
    it, the node's revert message and data (the contract's custom error). ProbeError when the
    chain cannot be asked."""
    data = encode_contract_call(BATCH_SETTLEMENT_ABI, "claimWithSignature",
                                build_voucher_claim_args(claims), bytes.fromhex(signature[2:]))
    try:
        gas = await rpc.call("eth_estimateGas", [{"to": BATCH_SETTLEMENT_ADDRESS,
                                                  "data": "0x" + data.hex()}])
    except RpcError as exc:  # the node's answer: it reverts (transport faults stay ProbeError)
        revert = exc.data if isinstance(exc.data, str) else ""
        return f"{exc.message[:200]} {revert[:10 + 64 * 3]}".strip() or "reverted"
    if not isinstance(gas, str) or not gas.startswith("0x"):
        raise ProbeError("eth_estimateGas: not a hex quantity")
    return int(gas, 16)


_CLAIMED = "0x" + keccak(text="Claimed(bytes32,address,uint128,uint128)").hex()
LOG_LOOKBACK_BLOCKS = 10_000  # as payments/chain_probe.py: many RPCs cap log ranges near it


async def find_claim_transaction(rpc: JsonRpc, channel_id: str, claimed_to: int, *,
                                 lookback_blocks: int = LOG_LOOKBACK_BLOCKS) -> str | None:
    """The transaction that raised the channel's totalClaimed to `claimed_to` (its `Claimed`
    event, within the last `lookback_blocks`), or None: how a claim whose replica died after
    broadcasting it gets its transaction back (and its gas metered)."""
    head = int(await rpc.call("eth_blockNumber", []), 16)
    logs = await rpc.call("eth_getLogs", [{
        "address": BATCH_SETTLEMENT_ADDRESS, "fromBlock": hex(max(head - lookback_blocks, 0)),
        "toBlock": hex(head), "topics": [_CLAIMED, "0x" + channel_id.lower().removeprefix("0x")]}])
    for entry in reversed(logs if isinstance(logs, list) else []):
        raw = bytes.fromhex(str(entry.get("data", "0x")).removeprefix("0x"))
        if len(raw) >= 64 and int.from_bytes(raw[32:64], "big") == claimed_to:
            return str(entry.get("transactionHash")) or None
    return None
