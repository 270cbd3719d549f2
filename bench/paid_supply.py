"""One level's payments for paid_load.py, per scheme: what its workers send (lanes, prepared before
the clock starts) and, after the timed phase, what the calls cost: the quote, what the payer paid
per call, and the gas per call from the transactions' receipts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from chain_gas import channel_gas, gas_used, metered
from devnet_gateway import (
    Gateway,
    Quote,
    fund_address,
    fund_payer,
    make_signer,
    payer_address,
    solana_blockhash_life_s,
)
from payment_lanes import (
    ChannelPayer,
    Deposit,
    Lane,
    approve_permit2,
    channel_lanes,
    decode_header,
    open_channels,
    shared_lanes,
    sign_payments,
    upto_client,
)
from x402.mechanisms.evm.batch_settlement.client.config import deposit_amount_for_request

FEE_METER_INTERVAL_S = 2  # channel plans: how often the gateway reads its transactions' gas
EVM_VALIDITY_MARGIN_S = 6  # the SDK facilitator refuses an authorization this close to validBefore


@dataclass
class Supply:
    """A level's payments: `lanes(n)` gives the workers' lanes for n calls (asked once for the
    warm-up, once for the timed phase), signed as late as possible."""

    scheme: str
    concurrency: int
    lanes: Callable[[int], list[Lane]]
    quote: Quote | None = None
    valid_for_s: float = math.inf  # how long a payment signed ahead stays valid
    deposits: list[Deposit] = field(default_factory=list)
    presigned: bool = True  # False: each channel voucher signed on the previous receipt
    setup_txs: list[str] = field(default_factory=list)  # upto: the payer's approve


async def prepare(scheme: str, gw: Gateway, chain: str, session: aiohttp.ClientSession, url: str,
                  body: bytes, quote: Quote | None, concurrency: int, calls: int,
                  presign_vouchers: bool) -> Supply:
    """Everything a level needs before its clock starts, for `calls` calls (warm-up included)."""
    if scheme == "free":
        return Supply(scheme, concurrency, lambda n: shared_lanes([""] * n, concurrency))
    assert quote is not None
    if scheme == "channel":
        return await _channels(gw, session, url, body, quote, concurrency, calls, presign_vouchers)
    await asyncio.to_thread(fund_payer, gw, payer_address(gw, chain), quote, calls)
    setup: list[str] = []
    if scheme == "upto":
        tx = await asyncio.to_thread(approve_permit2, f"{gw.base}/devnet/evm", gw.payer_key(chain),
                                     gw.keys()["evm_minter"], str(quote.required.accepts[0].asset))
        setup = [tx] if tx else []
        signer = upto_client(gw.payer_key(chain))
    else:
        signer = make_signer(gw, chain)
    if chain == "evm":
        valid_for = quote.max_timeout_s - EVM_VALIDITY_MARGIN_S
    else:
        valid_for = await asyncio.to_thread(solana_blockhash_life_s, gw)
    return Supply(scheme, concurrency,
                  lambda n: shared_lanes(sign_payments(signer, quote.required, n), concurrency),
                  quote, valid_for, setup_txs=setup)


async def _channels(gw: Gateway, session: aiohttp.ClientSession, url: str, body: bytes,
                    quote: Quote, concurrency: int, calls: int, presign: bool) -> Supply:
    """One payer and channel per worker, each funded and deposited once: enough for its share of
    the calls at their maximum (the voucher ceiling is the running total + the quote)."""
    per_channel = math.ceil(calls / concurrency) + 1  # + the deposit call's own charge
    deposit = max(int(quote.extra.get("minDeposit") or 0), (per_channel + 1) * quote.amount)
    payers = [ChannelPayer(f"{gw.base}/devnet/evm", quote.required, deposit)
              for _ in range(concurrency)]
    await asyncio.gather(*(asyncio.to_thread(fund_address, gw, quote.network, p.address, deposit)
                           for p in payers))
    deposits = await open_channels(session, url, body, payers)
    return Supply("channel", concurrency, channel_lanes(payers, deposits, quote.amount, presign),
                  quote, deposits=deposits, presigned=presign)


def costs(supply: Supply, receipts: list[str], base_url: str, calls_carried: int) -> dict[str, Any]:
    """What the ok calls (their PAYMENT-RESPONSE headers) cost: the quote, the mean paid per call,
    and on EVM the gas per call (exact, upto: each call's settlement; channel: the deposits
    measured, claims amortized as chain_gas.py models them, and whatever the gateway's claimer
    claimed meanwhile, from its own gas meter)."""
    rpc_url = f"{base_url}/devnet/evm"
    if supply.quote is None:
        return {}
    decoded = [decode_header(r) for r in receipts if r]
    out: dict[str, Any] = {"quote_atomic": supply.quote.amount}
    if supply.scheme == "channel":
        paid = [int(r["extra"]["chargedAmount"]) for r in decoded]
    else:
        paid = [int(r.get("amount") or 0) for r in decoded]
    out["paid_mean_atomic"] = sum(paid) / len(paid) if paid else math.nan
    if not supply.quote.network.startswith("eip155:"):
        return out  # Solana: fees in lamports, not gas
    if supply.scheme == "channel":
        found = gas_used(rpc_url, [d.transaction for d in supply.deposits])
        charge = round(out["paid_mean_atomic"]) if paid else supply.quote.amount
        sdk_deposit = int(deposit_amount_for_request(None, supply.quote.amount, supply.quote.amount,
                                                     supply.quote.extra))
        gas = channel_gas(list(found.values()), calls_carried, charge, sdk_deposit)
        meter = metered(base_url, steady_s=2 * FEE_METER_INTERVAL_S)
        claimed = sum(meter.get(kind, (0, 0))[1] for kind in ("claim", "sweep"))
        out |= {"deposits": len(supply.deposits), "deposit_gas_mean": gas.deposit_gas_mean,
                "claim_and_sweep_gas": gas.claim_gas, "gas_per_call": gas.run_gas_per_call,
                "steady_gas_per_call": gas.steady_gas_per_call, "sdk_deposit_atomic": sdk_deposit,
                "calls_carried": calls_carried,
                "metered": {kind: list(v) for kind, v in meter.items()},
                # the deposits and what the claimer claimed and swept during the run (measured;
                # charges below the threshold at the end are still unclaimed)
                "metered_gas_per_call": (sum(found.values()) + claimed) / max(1, calls_carried)}
        return out
    hashes = [str(r.get("transaction") or "") for r in decoded]
    found = gas_used(rpc_url, hashes)
    out |= {"txs": len(found), "gas_per_tx_mean": sum(found.values()) / len(found) if found else 0,
            "gas_per_call": sum(found.get(h, 0) for h in hashes) / max(1, len(hashes))}
    if supply.setup_txs:
        out["setup_gas"] = sum(gas_used(rpc_url, supply.setup_txs).values())
    return out
