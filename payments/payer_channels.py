"""The payer's side of x402 `batch-settlement` channels (issue 23 §5): deposit once into the
channel's escrow, then pay each call with a voucher, a signed running total the server claims from.

One SDK client scheme (`BatchSettlementEvmScheme`) per command and network, its channel records on
disk (`FileClientChannelStorage` in `<data dir>/channels`, created 0700: a record holds the latest
voucher, a bearer allowance) and a signer that reads the chain (`EthAccountSignerWithRPC`):
without a node the client can neither recover a channel it has no record of nor resync from a
corrective 402, so no channel is used without one.

Around the SDK:
- `locked`: a per-channel `fcntl` lock (`<dir>/client/<channelId>.lock`) held from reading the
  record to the receipt's update. The server takes one call per channel at a time, and the storage
  is read-modify-write: two processes paying from one key must not interleave.
- `prepare` reads the record (or the chain, when there is none) first, so a node that cannot be
  read stops the payment instead of letting the SDK sign on a running total of 0.
- the deposit the SDK sizes (the server's `minDeposit`, or the top-up a voucher needs) passes a
  `DepositGuard` before it is signed: `paywire pay`'s escrow cap, `paywire mcp`'s spend ledger.
  One that does not fit is never signed (`DepositRefused`: the caller pays without a channel).
- `settled` hands every paid answer's receipt to the client, so the next voucher is signed on the
  running total the server holds; `resync` applies a corrective 402 (the caller signs once more).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from x402 import x402ClientSync
from x402.mechanisms.evm.batch_settlement.client import (
    BatchSettlementClientDeps,
    BatchSettlementDepositStrategyContext,
    BatchSettlementEvmScheme,
    BatchSettlementEvmSchemeOptions,
    FileChannelStorageOptions,
    FileClientChannelStorage,
    RefundOptions,
    parse_announced_min_deposit,
    recover_channel,
)
from x402.mechanisms.evm.batch_settlement.client.config import DEFAULT_SALT
from x402.mechanisms.evm.batch_settlement.constants import SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.batch_settlement.errors import (
    ERR_CHANNEL_BUSY,
    ERR_CUMULATIVE_AMOUNT_BELOW_CLAIMED,
    ERR_CUMULATIVE_AMOUNT_MISMATCH,
)
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.schemas import (
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    PaymentResponseContext,
    SettleResponse,
)

from .client_limits import NO_COMPRESSION

SCHEME = SCHEME_BATCH_SETTLEMENT
# A 402 whose `error` says the payer's running total is not the server's: resync, sign again.
RESYNC_ERRORS = frozenset({ERR_CUMULATIVE_AMOUNT_MISMATCH, ERR_CUMULATIVE_AMOUNT_BELOW_CLAIMED})
CHANNEL_BUSY = ERR_CHANNEL_BUSY  # another call of the channel holds it: the same payment, later
REFUND_SECONDS = 120.0  # a refund's answer: the server claims and refunds in one transaction
_DIGITS = 30  # an amount longer than this is no amount (USDC's whole supply has 17 digits)


class ChannelError(Exception):
    """A channel could not be used (its state unread, a refund refused); the message says why."""


class DepositRefused(ChannelError):
    """The deposit the server needs does not fit what is left of the user's cap: nothing signed."""

    def __init__(self, needed: int, allowed: int, cap_name: str) -> None:
        super().__init__(f"the channel needs a deposit of {needed} atomic units and {cap_name} "
                         f"leaves {allowed}")
        self.needed, self.allowed = needed, allowed


@dataclass(frozen=True)
class DepositRequest:
    """A deposit about to be signed, in atomic units."""

    channel_id: str
    suggested: int  # what the SDK would deposit (the server's minDeposit, or the top-up)
    needed: int  # the least the server takes: the voucher's top-up, at least its minDeposit
    unspent: int  # what the channel holds above its running total, by the local record


class DepositGuard(Protocol):
    def __call__(self, request: DepositRequest) -> int:
        """The deposit to sign (at least `request.needed`), or DepositRefused."""


@dataclass(frozen=True)
class EscrowCap:
    """`paywire pay --deposit`: what one channel may hold unspent, deposit included."""

    cap_atomic: int
    cap_name: str = "--deposit"

    def __call__(self, request: DepositRequest) -> int:
        allowed = max(0, self.cap_atomic - request.unspent)
        amount = min(request.suggested, allowed)
        if amount < request.needed:
            raise DepositRefused(request.needed, allowed, self.cap_name)
        return amount


@dataclass(frozen=True)
class ChannelView:
    """A channel as the local record has it before a payment: the voucher's base and ceiling."""

    channel_id: str
    balance: int  # deposited, by the record
    charged: int  # the running total the next voucher is signed on
    ceiling: int  # charged + this call's price: what the voucher lets the server claim


@dataclass
class RefundAnswer:
    """An answer to a refund request, as the SDK's refund reads it (status, headers)."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)


RefundFetch = Callable[[str, dict[str, str]], RefundAnswer]

# The guard of the deposit being signed: set by `sign` in its own thread's context, read by the
# SDK's deposit strategy, which it calls from inside `create_payment_payload`.
_GUARD: ContextVar[DepositGuard | None] = ContextVar("deposit_guard", default=None)


def private_dir(path: Path) -> Path:
    """`path` (and its `client` folder, where the SDK writes), created or tightened to 0700."""
    for folder in (path, path / "client"):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder.stat().st_mode & 0o077:
            folder.chmod(0o700)
    return path


class ChannelPayer:
    """The SDK's channel client for one payer key and one EVM node, its records in `directory`.
    Blocking (the SDK signs and reads the chain synchronously): call its methods from a worker
    thread in async code, except `locked`."""

    def __init__(self, evm_key: str, rpc_url: str, directory: Path) -> None:
        from eth_account import Account

        self.directory = private_dir(directory)
        self.rpc_url = rpc_url
        self._signer = EthAccountSignerWithRPC(Account.from_key(evm_key), rpc_url)
        self._storage = FileClientChannelStorage(FileChannelStorageOptions(self.directory))
        self._scheme = BatchSettlementEvmScheme(self._signer, BatchSettlementEvmSchemeOptions(
            storage=self._storage, deposit_strategy=self._deposit))
        self._client = x402ClientSync().register("eip155:*", self._scheme)
        self._client.set_spend_controls(False)  # the caller's caps are the ones the user set

    @property
    def payer(self) -> str:
        return str(self._signer.address)

    def channel_id(self, requirement: PaymentRequirements) -> str:
        config = self._scheme.build_channel_config(requirement)
        return compute_channel_id(config, str(requirement.network)).lower()

    @asynccontextmanager
    async def locked(self, channel_id: str) -> AsyncIterator[None]:
        """Hold the channel's lock (waiting for another process or call that holds it)."""
        fd = os.open(self.directory / "client" / f"{channel_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        taking = asyncio.ensure_future(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX))
        try:
            await asyncio.shield(taking)
        except BaseException:
            # the thread may still get the lock: closing the file is what lets it go
            taking.add_done_callback(lambda _: os.close(fd))
            raise
        try:
            yield
        finally:
            os.close(fd)

    def prepare(self, requirement: PaymentRequirements) -> ChannelView:
        """The channel's record; without one, its state read from the chain (and recorded).
        ChannelError when the node cannot be read. Call it holding the lock."""
        channel_id = self.channel_id(requirement)
        record = self._storage.get(channel_id)
        if record is None:
            deps = BatchSettlementClientDeps(signer=self._signer, storage=self._storage,
                                             salt=DEFAULT_SALT)
            try:
                record = recover_channel(deps, requirement)
            except Exception as exc:  # web3's many failures (node down, no contract): one line
                raise ChannelError(
                    f"channel {channel_id} could not be read from the EVM node {self.rpc_url} "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
        charged = int(record.charged_cumulative_amount or 0)
        return ChannelView(channel_id, int(record.balance or 0), charged,
                           charged + int(requirement.amount))

    def sign(self, required: PaymentRequired, requirement: PaymentRequirements,
             extensions: dict[str, Any] | None, guard: DepositGuard) -> PaymentPayload:
        """A deposit (guarded) or a voucher for `requirement`, whose `max_timeout_seconds` bounds
        a deposit's authorization. Call it holding the lock, after `prepare`."""
        token = _GUARD.set(guard)
        try:
            only = required.model_copy(update={"accepts": [requirement]})
            payload = self._client.create_payment_payload(only, extensions=extensions)
        finally:
            _GUARD.reset(token)
        assert isinstance(payload, PaymentPayload)
        return payload

    def _deposit(self, context: BatchSettlementDepositStrategyContext) -> int:
        guard = _GUARD.get()
        extra = context.payment_requirements.extra or {}
        announced = parse_announced_min_deposit(extra.get("minDeposit"), int(context.request_amount))
        needed = max(int(context.minimum_deposit_amount), announced or 0)
        if guard is None:  # (never: every `sign` sets one) no cap known, no deposit
            raise DepositRefused(needed, 0, "no deposit cap")
        charged = int(context.client_context.charged_cumulative_amount or 0)
        return guard(DepositRequest(context.channel_id.lower(), int(context.deposit_amount), needed,
                                    max(0, int(context.current_balance) - charged)))

    def settled(self, payload: PaymentPayload, requirement: PaymentRequirements,
                receipt: SettleResponse | None) -> str | None:
        """The receipt of a paid answer, applied to the channel's record (a deposit's amount, the
        call's charge); what was wrong with it, if it could not be applied."""
        if receipt is None or not receipt.success:
            return None
        try:
            self._client.handle_payment_response(PaymentResponseContext(
                payment_payload=payload, requirements=requirement, settle_response=receipt))
        except ValueError as exc:  # the SDK's refusal of a charge above the voucher's price
            return f"the receipt was not applied to the channel's record ({exc})"
        return None

    def resync(self, payload: PaymentPayload, requirement: PaymentRequirements,
               corrective: PaymentRequired) -> bool:
        """A corrective 402 applied: the record takes the server's running total once the SDK
        checked it (its own voucher's signature, the chain's claimed total)."""
        try:
            recovered = self._client.handle_payment_response(PaymentResponseContext(
                payment_payload=payload, requirements=requirement, payment_required=corrective))
        except Exception:  # noqa: BLE001 - a node that cannot be read: no resync, the 402 stands
            return False
        return recovered is not None

    def refund(self, url: str, fetch: RefundFetch) -> SettleResponse:
        """The SDK's cooperative refund of the channel behind `url`: what it holds above its
        running total goes back to the payer; ChannelError saying why when it does not."""
        try:
            return self._scheme.refund(url, RefundOptions(fetch=fetch))  # type: ignore[arg-type]
        except ChannelError:
            raise
        except Exception as exc:  # the SDK's RuntimeErrors and the node's failures: one line
            raise ChannelError(' '.join(str(exc).split())[:300] or type(exc).__name__) from None


def post_empty(timeout: float = REFUND_SECONDS) -> RefundFetch:
    """A refund fetch that POSTs an empty body (the SDK's GETs; paywire's paid routes are POST,
    and a refund buys no call). The answer's body is not read: the headers say it all."""
    def fetch(url: str, headers: dict[str, str]) -> RefundAnswer:
        try:
            with httpx.Client(timeout=timeout) as http, http.stream(
                    "POST", url, headers={**headers, **NO_COMPRESSION}) as answer:
                return RefundAnswer(answer.status_code, dict(answer.headers))
        except httpx.HTTPError as exc:
            raise ChannelError(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    return fetch


def charged_atomic(receipt: SettleResponse | None, requirement: Any) -> int | None:
    """A channel receipt's `extra.chargedAmount` (what the call was charged), when it is a whole
    number no larger than the call's price; else None."""
    extra = (receipt.extra or {}) if receipt is not None and receipt.success else {}
    value = extra.get("chargedAmount")
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _DIGITS):
        return None
    return int(value) if int(value) <= int(requirement.amount) else None


def channel_state(receipt: SettleResponse | None) -> dict[str, Any]:
    """A channel receipt's `extra.channelState` (channelId, balance, chargedCumulativeAmount...)."""
    state = (receipt.extra or {}).get("channelState") if receipt is not None else None
    return state if isinstance(state, dict) else {}


def needs_resync(required: PaymentRequired | Any) -> bool:
    """Whether a 402 is the corrective one: the server's running total is not the payer's."""
    return isinstance(required, PaymentRequired) and required.error in RESYNC_ERRORS
