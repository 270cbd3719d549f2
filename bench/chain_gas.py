"""Gas of the bench's on-chain transactions, read from their receipts, and a channel's gas per call
with its deposit and claims amortized over the calls it carried.

Receipts come from the devnet's JSON-RPC (`eth_getTransactionReceipt`, its `gasUsed`: intrinsic +
calldata + execution), in batches. Claims are not sent by the bench: where the gateway's claimer
has not claimed, a claim's gas is the contracts note's measurement on this devnet (docs/devnet.md:
1 channel 75,668 gas, 10 channels 268,694), taken as linear in the channels claimed, which those
two points fix; a sweep (`settle`, moving the claimed total to the receiver) is 64,034.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass
from decimal import Decimal

RPC_BATCH = 100  # the devnet's JSON-RPC batch limit (payments/devnet/jsonrpc.py MAX_BATCH)
CLAIM_1_GAS = 75_668  # claimWithSignature of one channel, measured (docs/devnet.md)
CLAIM_10_GAS = 268_694  # of ten channels in one transaction
SWEEP_GAS = 64_034  # settle(): the receiver's claimed total moved to it
CLAIM_GAS_PER_CHANNEL = (CLAIM_10_GAS - CLAIM_1_GAS) / 9
CLAIM_GAS_FIXED = CLAIM_1_GAS - CLAIM_GAS_PER_CHANNEL
CLAIMS_PER_BATCH = 100  # PAYWIRE_CHANNEL_MAX_CLAIMS_PER_BATCH's default (the design note)
CLAIM_THRESHOLD_ATOMIC = 1_000_000  # PAYWIRE_CHANNEL_CLAIM_THRESHOLD_USD's default, $1.00


def gas_used(rpc_url: str, tx_hashes: list[str]) -> dict[str, int]:
    """gasUsed of each mined transaction (a hash without a receipt is left out)."""
    found: dict[str, int] = {}
    unique = sorted(set(h for h in tx_hashes if h))
    for start in range(0, len(unique), RPC_BATCH):
        chunk = unique[start:start + RPC_BATCH]
        calls = [{"jsonrpc": "2.0", "id": i, "method": "eth_getTransactionReceipt", "params": [h]}
                 for i, h in enumerate(chunk)]
        req = urllib.request.Request(rpc_url, data=json.dumps(calls).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answers = json.loads(r.read())
        for answer in answers:
            receipt = answer.get("result")
            if receipt:
                found[chunk[answer["id"]]] = int(receipt["gasUsed"], 16)
    return found


_METRIC = re.compile(r'^(paywire_chain_gas_used|paywire_chain_fee_transactions|'
                     r'paywire_chain_fee_transactions_unread)(?:_total)?\{([^}]*)\} ([0-9.e+]+)$')


def metered(base_url: str, steady_s: float, settle_s: float = 30.0) -> dict[str, tuple[int, int]]:
    """The gateway's own gas meter (/metrics, payments/chain_fees.py, which reads the chain every
    PAYWIRE_CHAIN_FEES_INTERVAL_SECONDS): per kind of transaction (claim, sweep...),
    (transactions, gas), once no transaction waits to be read and the figures held for
    `steady_s` (a meter pass or two: what the claimer sent last is counted), or after `settle_s`."""
    deadline = time.monotonic() + settle_s
    last: dict[str, tuple[int, int]] | None = None
    since = time.monotonic()
    while True:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as r:
            text = r.read().decode()
        kinds: dict[str, list[int]] = {}
        waiting = 0
        for line in text.splitlines():
            match = _METRIC.match(line)
            if not match:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            value = int(float(match[3]))
            if match[1] == "paywire_chain_fee_transactions_unread":
                waiting += value if labels.get("state") == "waiting" else 0
                continue
            slot = kinds.setdefault(labels.get("kind", "?"), [0, 0])
            slot[0 if match[1] == "paywire_chain_fee_transactions" else 1] += value
        now = {k: (v[0], v[1]) for k, v in kinds.items()}
        if now != last or waiting:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= steady_s:
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(0.2)  # poll interval: the fee reader runs in the gateway's background


def claim_gas(channels: int) -> int:
    """One claim transaction over `channels` channels (the linear model of the two measurements)."""
    return round(CLAIM_GAS_FIXED + CLAIM_GAS_PER_CHANNEL * channels)


def claims_gas(channels: int, per_batch: int = CLAIMS_PER_BATCH) -> int:
    """Claiming `channels` channels once, in batches of at most `per_batch`."""
    full, rest = divmod(channels, per_batch)
    return full * claim_gas(per_batch) + (claim_gas(rest) if rest else 0)


@dataclass
class ChannelGas:
    deposit_gas_mean: float  # measured, per channel
    claim_gas: int  # one claim of every channel of the run (model), + one sweep
    run_gas_per_call: float  # (deposits + that claim + sweep) / every call the channels carried
    steady_gas_per_call: float  # one deposit per deposit's worth of calls, a claim per threshold


def channel_gas(deposit_gas: list[int], calls_carried: int, charge_atomic: int,
                deposit_atomic: int) -> ChannelGas:
    """A channel's gas per call: over this run (each channel deposited once, claimed once at the
    end, one sweep), and steady: a busy channel claimed each time its unclaimed total reaches the
    default threshold (before the 300 s interval), in full batches, one sweep per batch, and a
    deposit of `deposit_atomic` (e.g. the SDK client's default) each time the last one is spent."""
    channels = len(deposit_gas)
    deposit_mean = sum(deposit_gas) / channels
    run_claim = claims_gas(channels) + SWEEP_GAS
    run_per_call = (sum(deposit_gas) + run_claim) / max(1, calls_carried)
    per_claim = claim_gas(CLAIMS_PER_BATCH) / CLAIMS_PER_BATCH + SWEEP_GAS / CLAIMS_PER_BATCH
    calls_per_claim = max(1, CLAIM_THRESHOLD_ATOMIC // max(1, charge_atomic))
    calls_per_deposit = max(1, deposit_atomic // max(1, charge_atomic))  # (a top-up when spent)
    steady = per_claim / calls_per_claim + deposit_mean / calls_per_deposit
    return ChannelGas(deposit_mean, run_claim, run_per_call, steady)


def usd(atomic: float) -> str:
    return f"${Decimal(atomic) / Decimal(1_000_000):.6f}"
