"""What paid_load.py's workers send, per scheme, as the x402 SDK's own clients sign it.

A lane is one worker's supply of `PAYMENT-SIGNATURE` values: `next_payment()` gives the next one
("" for a free call, None when the lane is done) and `answered()` hears the call's answer.

- exact, upto: payments signed ahead of the timed phase, shared by all workers (each is a
  self-contained authorization, valid `maxTimeoutSeconds`). upto's payer approves Permit2 once.
- channel (batch-settlement): one channel per worker, since a channel serves one call at a time
  (the next voucher signs on the running total the previous call left). Each channel is a payer
  of its own with one deposit, paid before the clock starts. Its vouchers are either signed ahead
  (`presigned`: only where the route's charge is fixed, the charge being learnt from the deposit
  call's receipt) or signed on each receipt (`live`: the SDK client's payment-response hook
  advances its running total by the receipt's chargedAmount), the signing outside the call's
  measured latency but inside the client's CPU.
- free: no payment at all.

Nothing of paywire's own is imported: the gateway is reached over HTTP only, like any client.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

RECEIPT_HEADER = "PAYMENT-RESPONSE"
REQUIRED_HEADER = "PAYMENT-REQUIRED"
PERMIT2_GAS_WEI = 10**17  # ETH the upto payer gets for its one approve transaction
GAS_TX_LIMIT = 100_000  # an ERC-20 approve needs ~46k


def encode_payload(payload: Any) -> str:
    """A signed x402 payload as its PAYMENT-SIGNATURE header value."""
    data = payload.model_dump(by_alias=True, exclude_none=True)
    return base64.b64encode(json.dumps(data, separators=(",", ":")).encode()).decode()


def decode_header(value: str) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(value)))


class Lane(Protocol):
    def next_payment(self) -> str | None:
        """The next call's PAYMENT-SIGNATURE ("" for none); None when this lane is done."""

    def answered(self, status: int, headers: Any) -> None:
        """The call's answer (its status and headers), for lanes whose next payment depends on it."""


class SharedLane:
    """Workers taking payments from one shared iterator: each payment is sent exactly once."""

    def __init__(self, payments: Iterator[str]) -> None:
        self._payments = payments

    def next_payment(self) -> str | None:
        return next(self._payments, None)

    def answered(self, status: int, headers: Any) -> None:
        pass


def shared_lanes(payments: list[str], concurrency: int) -> list[Lane]:
    shared = iter(payments)
    return [SharedLane(shared) for _ in range(concurrency)]


def sign_payments(client: Any, required: Any, n: int) -> list[str]:
    """`n` distinct signed payments for a one-option quote."""
    headers = [encode_payload(client.create_payment_payload(required)) for _ in range(n)]
    if len(set(headers)) != n:
        raise SystemExit("the SDK signed identical payments; they would be refused as replays")
    return headers


# ---------------------------------------------------------------------- upto


def upto_client(payer_key: str) -> Any:
    """The SDK's sync client with its upto scheme (Permit2) for the payer."""
    from eth_account import Account
    from x402 import x402ClientSync
    from x402.mechanisms.evm.signers import EthAccountSigner
    from x402.mechanisms.evm.upto import UptoEvmClientScheme

    client = x402ClientSync()
    client.set_spend_controls(False)
    client.register("eip155:*", UptoEvmClientScheme(EthAccountSigner(Account.from_key(payer_key))))
    return client


def approve_permit2(rpc_url: str, payer_key: str, gas_funder_key: str, token: str) -> str | None:
    """The payer approves Permit2 for `token` once, as a wallet would (its own transaction, its gas
    sent first from `gas_funder_key`, the devnet's minter: the faucet gives USDC, not ETH).
    Returns the approve transaction's hash, None when the allowance was already there."""
    from eth_account import Account
    from web3 import Web3
    from x402.mechanisms.evm.constants import PERMIT2_ADDRESS

    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 60}))
    payer = Account.from_key(payer_key)
    abi = [{"name": n, "type": "function", "stateMutability": m, "inputs": i, "outputs": o}
           for n, m, i, o in (
               ("approve", "nonpayable", [{"name": "s", "type": "address"},
                                          {"name": "a", "type": "uint256"}], [{"type": "bool"}]),
               ("allowance", "view", [{"name": "o", "type": "address"},
                                      {"name": "s", "type": "address"}], [{"type": "uint256"}]))]
    usdc = w3.eth.contract(address=Web3.to_checksum_address(token), abi=abi)
    if usdc.functions.allowance(payer.address, PERMIT2_ADDRESS).call() >= 2**255:
        return None
    fees = {"maxFeePerGas": 2 * int(w3.eth.get_block("latest")["baseFeePerGas"]) + 10**6,
            "maxPriorityFeePerGas": 10**6, "chainId": w3.eth.chain_id}
    funder = Account.from_key(gas_funder_key)
    _send(w3, funder, {"to": payer.address, "value": PERMIT2_GAS_WEI, "gas": 21_000, **fees})
    tx = usdc.functions.approve(PERMIT2_ADDRESS, 2**256 - 1).build_transaction(
        {"from": payer.address, "gas": GAS_TX_LIMIT, **fees})
    return _send(w3, payer, tx)


def _send(w3: Any, account: Any, tx: dict[str, Any]) -> str:
    tx = {**tx, "nonce": w3.eth.get_transaction_count(account.address, "pending")}
    tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60)
    if receipt["status"] != 1:
        raise SystemExit(f"devnet transaction {tx_hash.hex()} reverted")
    return str(tx_hash.to_0x_hex())


# ---------------------------------------------------------------------- channels


class ChannelPayer:
    """A payer of its own with one channel, paid through the SDK's unchanged channel client (its
    channel state in the SDK's in-memory storage, fed every receipt)."""

    def __init__(self, rpc_url: str, required: Any, deposit_atomic: int) -> None:
        from eth_account import Account
        from x402 import x402ClientSync
        from x402.mechanisms.evm.batch_settlement.client import (
            BatchSettlementEvmScheme,
            BatchSettlementEvmSchemeOptions,
        )
        from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

        self.account = Account.create()
        self.required = required
        options = BatchSettlementEvmSchemeOptions(deposit_strategy=lambda _ctx: deposit_atomic)
        self.client = x402ClientSync()
        self.client.set_spend_controls(False)
        self.client.register(str(required.accepts[0].network), BatchSettlementEvmScheme(
            EthAccountSignerWithRPC(self.account, rpc_url), options))

    @property
    def address(self) -> str:
        return str(self.account.address)

    def sign(self) -> Any:
        """The next payload: the deposit first, then a voucher on the running total as known."""
        return self.client.create_payment_payload(self.required)

    def feed(self, payload: Any, status: int, headers: Any) -> None:
        """The answer to `payload`, to the SDK client's payment-response hook: a receipt advances
        the running total by its chargedAmount; a corrective 402 resyncs it."""
        from x402.http.utils import decode_payment_response_header
        from x402.schemas import PaymentRequired
        from x402.schemas.hooks import PaymentResponseContext

        receipt, required = headers.get(RECEIPT_HEADER), headers.get(REQUIRED_HEADER)
        if status == 200 and receipt:
            ctx = PaymentResponseContext(payment_payload=payload, requirements=payload.accepted,
                                         settle_response=decode_payment_response_header(receipt))
        elif status == 402 and required:
            ctx = PaymentResponseContext(payment_payload=payload, requirements=payload.accepted,
                                         payment_required=PaymentRequired.model_validate(
                                             decode_header(required)))
        else:
            return
        self.client.handle_payment_response(ctx)

    def assume_charged(self, payload: Any, charge: int, total: int) -> None:
        """Advance the client's running total as a receipt charging `charge` would (pre-signing a
        route whose charge is fixed); the real receipts are checked against it afterwards."""
        from x402.schemas import SettleResponse
        from x402.schemas.hooks import PaymentResponseContext

        settled = SettleResponse(success=True, transaction="", network=payload.accepted.network,
                                 extra={"chargedAmount": str(charge),
                                        "channelState": {"chargedCumulativeAmount": str(total)}})
        self.client.handle_payment_response(PaymentResponseContext(
            payment_payload=payload, requirements=payload.accepted, settle_response=settled))


class PresignedChannelLane:
    """A channel's vouchers signed ahead, each on the total the previous one's fixed charge leaves."""

    def __init__(self, payer: ChannelPayer, charge: int, total: int, n: int) -> None:
        self.payer = payer
        self.total = total
        headers = []
        for _ in range(n):
            payload = payer.sign()
            self.total += charge
            payer.assume_charged(payload, charge, self.total)
            headers.append(encode_payload(payload))
        self._headers = iter(headers)

    def next_payment(self) -> str | None:
        return next(self._headers, None)

    def answered(self, status: int, headers: Any) -> None:
        pass


class LiveChannelLane:
    """A channel's vouchers signed one at a time, each after the previous call's receipt."""

    def __init__(self, payer: ChannelPayer, n: int) -> None:
        self.payer = payer
        self._left = n
        self._pending: Any = None

    def next_payment(self) -> str | None:
        if self._left <= 0:
            return None
        self._left -= 1
        self._pending = self.payer.sign()
        return encode_payload(self._pending)

    def answered(self, status: int, headers: Any) -> None:
        self.payer.feed(self._pending, status, headers)


@dataclass
class Deposit:
    payer: str
    transaction: str
    amount: int
    charged: int  # the deposit call's own charge
    total: int  # the channel's running total after it


async def open_channels(session: aiohttp.ClientSession, url: str, body: bytes,
                        payers: list[ChannelPayer]) -> list[Deposit]:
    """Each payer's first call: a deposit (through the facilitator, on chain) and its charge."""

    async def deposit(payer: ChannelPayer) -> Deposit:
        payload = await asyncio.to_thread(payer.sign)
        if payload.payload.get("type") != "deposit":
            raise SystemExit(f"the channel client signed a {payload.payload.get('type')} first")
        headers = {"Content-Type": "application/json", "PAYMENT-SIGNATURE": encode_payload(payload)}
        async with session.post(url, data=body, headers=headers) as r:
            raw = await r.read()
            if r.status != 200 or not r.headers.get(RECEIPT_HEADER):
                raise SystemExit(f"a channel deposit was refused: {r.status} {raw[:300]!r}")
            payer.feed(payload, r.status, r.headers)
            receipt = decode_header(r.headers[RECEIPT_HEADER])
        extra = receipt.get("extra") or {}
        return Deposit(payer.address, str(receipt.get("transaction") or ""),
                       int(payload.payload["deposit"]["amount"]), int(extra["chargedAmount"]),
                       int(extra["channelState"]["chargedCumulativeAmount"]))

    return list(await asyncio.gather(*(deposit(p) for p in payers)))


def channel_lanes(payers: list[ChannelPayer], deposits: list[Deposit], quote: int,
                  presigned: bool) -> Callable[[int], list[Lane]]:
    """Lanes for `n` calls over the channels (one lane per channel), as a function of n: the
    warm-up and the timed phase each ask for theirs; pre-signed ones carry on the running total."""
    totals = {d.payer: d.total for d in deposits}
    charge = deposits[0].charged
    if presigned and any(d.charged != quote for d in deposits):
        raise SystemExit(f"a deposit call was charged {charge}, not its quote {quote}: the route's "
                         "charge is not fixed, so its vouchers cannot be signed ahead (--vouchers live)")

    def lanes(n: int) -> list[Lane]:
        share = [n // len(payers) + (1 if i < n % len(payers) else 0) for i in range(len(payers))]
        made: list[Lane] = []
        for payer, k in zip(payers, share, strict=True):
            if presigned:
                lane = PresignedChannelLane(payer, charge, totals[payer.address], k)
                totals[payer.address] = lane.total
                made.append(lane)
            else:
                made.append(LiveChannelLane(payer, k))
        return made

    return lanes
