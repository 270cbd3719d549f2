"""`paywire mcp`: a local stdio MCP server that offers a remote x402 MCP server's tools and pays
for them from the user's key, within spend caps.

A desktop agent starts it as a command. It connects to the remote server (streamable HTTP: a
paywire's `/mcp`, or any server speaking x402's MCP transport), passes its tool list through
(names, schemas, descriptions, pages), and forwards each `tools/call`. When the remote answers
PaymentRequired (a tool result with `isError` and the quote), it picks the option for the
configured network, checks the caps BEFORE signing (per call: the price; per UTC day: what the
spend ledger counts plus the price, reserved in one transaction), signs with the user's key (the
code of `paywire pay`: `upto` on EVM when offered and the payer approved Permit2, so the call is
charged what it used; the ledger counts the maximum until the receipt says what moved), calls
again with the payment in `_meta["x402/payment"]`, and returns the result with the receipt
(`_meta["x402/payment-response"]`). Over a cap: an `isError` result naming the cap, the price and
how to raise it; nothing is signed.

With a deposit cap (`--max-deposit`) it pays through an x402 `batch-settlement` channel when the
remote offers one (payments/payer_channels.py): a deposit once, reserved in the spend ledger
against that cap (escrow, not spent: never counted against a day), then a voucher per call,
whose rise of the channel's highest signed ceiling is reserved against the day; each receipt is
handed to the channel's client (the SDK's MCP client does not), so the next voucher is signed on
the right running total; a corrective answer resyncs it and the call is signed once more.
`refund_channels` gets back what the channels hold above their charges.

stdout is the MCP channel: logs go to stderr, and never carry the key, a payment or a tool's
arguments.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.exceptions import McpError
from x402.http.utils import (
    decode_payment_signature_header,
    encode_payment_required_header,
    encode_payment_response_header,
)
from x402.mcp.types import MCPToolResult
from x402.mcp.utils import (
    attach_payment_to_meta,
    extract_payment_required_from_error,
    extract_payment_required_from_result,
    extract_payment_response_from_meta,
)
from x402.schemas import (
    PaymentPayload,
    PaymentRequired,
    PaymentRequiredV1,
    PaymentRequirements,
    ResourceInfo,
    SettleResponse,
)

from agent.version import VERSION
from payments.client_limits import (
    DEFAULT_LIMITS,
    NO_COMPRESSION,
    AnswerTooLarge,
    ClientLimits,
    mib,
    read_bounded,
    refuse_compressed,
    retry_delay,
)
from payments.money import display_usd, usd_to_atomic
from payments.payer import (
    PayerKeys,
    PayError,
    Scheme,
    channel_option,
    choose_option,
    evm_node,
    identified_extensions,
    payable_scheme,
    settled_atomic,
    sign_payment,
    signed_validity,
    usd_value,
    validity_note,
)
from payments.payer_channels import (
    CHANNEL_BUSY,
    REFUND_SECONDS,
    ChannelError,
    ChannelPayer,
    DepositRefused,
    DepositRequest,
    RefundAnswer,
    channel_state,
    charged_atomic,
    needs_resync,
)
from payments.spend_caps import (
    DepositOverCap,
    OverCap,
    SpendLedger,
    expiry,
    micros_usd,
    usd_micros,
    utc_now,
)

log = logging.getLogger("paywire.mcp")

PROBE_TIMEOUT = timedelta(seconds=120)  # an unpaid call: the tool runs, or the quote comes back
LONGEST_PAID_WAIT = 600  # seconds; a paid call waits as long as its payment is valid, up to this
MAX_ARGUMENT_BYTES = 1024 * 1024  # a tool call's arguments, as JSON, before anything is sent


class ProxyError(Exception):
    """The proxy cannot start (the remote server is unreachable, not MCP); one line says why."""


@dataclass(frozen=True)
class Caps:
    per_call: Decimal  # USD
    per_day: Decimal


@dataclass(frozen=True)
class ProxyConfig:
    server_url: str
    keys: PayerKeys
    caps: Caps
    ledger_path: Path
    network: str | None = None  # "evm" | "solana" | a network id; None: the first payable
    solana_rpc_url: str | None = None
    limits: ClientLimits = DEFAULT_LIMITS  # what the remote is allowed (validity, answer sizes)
    scheme: Scheme = "auto"  # auto: `upto` on EVM when offered and payable, else `exact`
    evm_rpc_url: str | None = None  # the node the payer's Permit2 allowance is read from
    max_deposit: Decimal | None = None  # USD the channels may hold in escrow; None: no channel
    channel_dir: Path | None = None  # the channels' records (the SDK's files)


def _result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


def _as_x402(result: types.CallToolResult) -> MCPToolResult:
    """The SDK's view of a tool result, for its PaymentRequired and receipt readers."""
    return MCPToolResult(
        content=[item.model_dump(by_alias=True, exclude_none=True) for item in result.content],
        is_error=bool(result.isError), meta=dict(result.meta or {}),
        structured_content=result.structuredContent)


def _payer_address(keys: PayerKeys, network: str) -> str | None:
    if network.startswith("eip155:") or not network.startswith("solana"):
        if keys.evm_key:
            from eth_account import Account

            return str(Account.from_key(keys.evm_key).address)
        return None
    if keys.solana_key:
        from solders.keypair import Keypair

        return str(Keypair.from_base58_string(keys.solana_key).pubkey())
    return None


def _valid_before(payload: Any) -> int | None:
    """An EVM authorization's `validBefore` (EIP-3009) or a Permit2 permit's `deadline`
    (seconds), when the payment has one."""
    inner = getattr(payload, "payload", None)
    inner = inner if isinstance(inner, dict) else {}
    authorization, permit = inner.get("authorization"), inner.get("permit2Authorization")
    value = (authorization.get("validBefore") if isinstance(authorization, dict)
             else permit.get("deadline") if isinstance(permit, dict) else None)
    text = str(value) if value is not None else ""
    return int(text) if text.isdigit() and len(text) <= 12 else None


def _deposit_valid_before(payload: PaymentPayload) -> int | None:
    """A channel deposit's ERC-3009 `validBefore` (seconds), when the payment is a deposit."""
    deposit = payload.payload.get("deposit")
    authorization = deposit.get("authorization") if isinstance(deposit, dict) else None
    erc3009 = authorization.get("erc3009Authorization") if isinstance(authorization, dict) else None
    text = str(erc3009.get("validBefore", "")) if isinstance(erc3009, dict) else ""
    return int(text) if text.isdigit() and len(text) <= 12 else None


def _over_per_call(name: str, price: Decimal, where: str, cap: Decimal) -> types.CallToolResult:
    return _result(
        f"paywire mcp: not paid: {name} costs {display_usd(price)} ({where}), above the "
        f"per-call cap {display_usd(cap)}. Raise it with --max-per-call or "
        "PAYWIRE_MCP_MAX_PER_CALL to pay it. Nothing was signed.")


def _over_day(name: str, price: Decimal, where: str, over: OverCap, cap: Decimal) -> types.CallToolResult:
    return _result(
        f"paywire mcp: not paid: {name} costs {display_usd(price)} ({where}); today "
        f"(UTC {over.day}) {display_usd(micros_usd(over.spent_micros))} is already spent of "
        f"the daily cap {display_usd(cap)}. Raise it with --max-per-day or "
        "PAYWIRE_MCP_MAX_PER_DAY, or wait for the next UTC day. Nothing was signed.")


@dataclass
class _LedgerDeposits:
    """A channel deposit reserved in the spend ledger against --max-deposit before it is signed
    (called by the channel's client, in its worker thread); `row`: the reservation."""

    ledger: SpendLedger
    server: str
    tool: str
    network: str
    asset: str
    pay_to: str
    cap_micros: int
    row: int | None = None

    def __call__(self, request: DepositRequest) -> int:
        try:
            self.row, amount = self.ledger.reserve_deposit(
                server=self.server, tool=self.tool, network=self.network, asset=self.asset,
                channel_id=request.channel_id, suggested_atomic=request.suggested,
                needed_atomic=request.needed, pay_to=self.pay_to, cap_micros=self.cap_micros)
        except DepositOverCap as over:
            raise DepositRefused(request.needed, max(0, over.cap_micros - over.held_micros),
                                 "--max-deposit") from None
        return amount


class PayingProxy:
    """The proxy's behaviour over one upstream session: list tools, call them, pay within caps."""

    def __init__(self, config: ProxyConfig, session: ClientSession, ledger: SpendLedger) -> None:
        self.config = config
        self.session = session
        self.ledger = ledger
        self._channels: dict[str, ChannelPayer] = {}  # by EVM node: one client for the command

    async def list_tools(self, cursor: str | None) -> types.ListToolsResult:
        """The remote's page of tools as it is (names, schemas, descriptions, next cursor)."""
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        return await self.session.list_tools(params=params)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if len(json.dumps(arguments, separators=(",", ":"))) > MAX_ARGUMENT_BYTES:
            return _result(f"paywire mcp: the arguments of {name} are over {MAX_ARGUMENT_BYTES} "
                           "bytes as JSON; nothing was sent")
        try:
            first = await self.session.call_tool(name, arguments, read_timeout_seconds=PROBE_TIMEOUT)
        except McpError as exc:  # earlier x402 MCP servers: a JSON-RPC error 402 carrying the quote
            required = extract_payment_required_from_error(exc.error.model_dump(by_alias=True))
            if required is None:
                raise
            return await self._pay_and_call(name, arguments, required)
        required = extract_payment_required_from_result(_as_x402(first)) if first.isError else None
        if required is None:
            return first  # free, or a plain error: the remote's answer as it is
        return await self._pay_and_call(name, arguments, required)

    async def _pay_and_call(self, name: str, arguments: dict[str, Any],
                            required: PaymentRequired | PaymentRequiredV1) -> types.CallToolResult:
        config, caps = self.config, self.config.caps
        through = self._channel_option(required)
        if through is not None and isinstance(required, PaymentRequired):
            answered = await self._pay_by_channel(name, arguments, required, *through)
            if answered is not None:
                return answered
        try:
            chosen, why = await payable_scheme(
                required, choose_option(required, config.keys, config.network, config.scheme),
                config.keys, config.evm_rpc_url, config.scheme)
        except PayError as exc:
            return _result(f"paywire mcp: not paid: {exc}. Nothing was signed.")
        if why:
            log.warning("%s: %s", name, why)
        amount, network, asset = chosen.get_amount(), str(chosen.network), str(chosen.asset)
        price = usd_value(amount, asset, network)
        if price is None:
            return _result(f"paywire mcp: not paid: {name} asks {amount[:40]} atomic units of asset "
                           f"{asset[:80]} on {network[:80]}, which is not that network's USDC; "
                           "refusing to pay what cannot be valued. Nothing was signed.")
        where = f"{amount} atomic units of USDC on {network}"
        if price > caps.per_call:
            return _over_per_call(name, price, where, caps.per_call)
        micros = usd_to_atomic(price)
        try:
            row = await asyncio.to_thread(
                self.ledger.reserve, server=config.server_url, tool=name, network=network,
                asset=asset, amount_atomic=int(amount), amount_micros=micros,
                pay_to=str(getattr(chosen, "pay_to", "") or ""), cap_micros=usd_micros(caps.per_day))
        except OverCap as over:
            return _over_day(name, price, where, over, caps.per_day)
        max_validity = config.limits.max_validity_seconds
        note = validity_note(chosen, max_validity)
        if note:
            log.warning("%s: %s", name, note)
        try:
            payload = await sign_payment(required, chosen, config.keys, config.solana_rpc_url,
                                         max_validity, config.evm_rpc_url)
        except BaseException as exc:
            await asyncio.to_thread(self.ledger.release, row)
            if isinstance(exc, Exception):
                log.warning("signing a payment for %s failed: %s", name, type(exc).__name__)
                why = str(exc) if isinstance(exc, PayError) else type(exc).__name__
                return _result(f"paywire mcp: not paid: the payment could not be signed "
                               f"({why}). Nothing was charged.")
            raise
        validity = signed_validity(chosen, max_validity)
        await asyncio.to_thread(
            self.ledger.mark_signed, row, payer=_payer_address(config.keys, network),
            expires_at=expiry(utc_now(), validity, _valid_before(payload)))
        params = attach_payment_to_meta({"name": name, "arguments": arguments}, payload)
        wait = min(max(validity, 60), LONGEST_PAID_WAIT)
        try:
            paid = await self.session.call_tool(name, arguments, meta=params["_meta"],
                                                read_timeout_seconds=timedelta(seconds=wait))
        except Exception as exc:
            await asyncio.to_thread(self.ledger.finish, row, "unknown", detail=type(exc).__name__)
            log.warning("paid call to %s got no answer (%s): its payment counts as unknown",
                        name, type(exc).__name__)
            return _result(
                f"paywire mcp: the paid call to {name} got no answer ({type(exc).__name__}); the "
                f"payment of {display_usd(price)} ({where}) may have been settled and counts "
                "against today's cap (`paywire mcp --spent` lists it).")
        return await self._settled(name, row, paid, chosen, where)

    async def _settled(self, name: str, row: int, paid: types.CallToolResult, chosen: Any,
                       where: str) -> types.CallToolResult:
        """Record what the answer says of the payment; the answer goes back with its receipt."""
        answer = _as_x402(paid)
        receipt: SettleResponse | None = extract_payment_response_from_meta(answer)
        refused = extract_payment_required_from_result(answer) if paid.isError else None
        price = usd_value(chosen.get_amount(), str(chosen.asset), str(chosen.network)) or Decimal(0)
        charged = _charged(receipt, chosen)
        if receipt is not None and receipt.success:
            status = "settled"
            paid_text = (f"{display_usd(micros_usd(charged[1]))} of at most {display_usd(price)} "
                         "(upto)" if charged is not None else display_usd(price))
            note = f"paid {paid_text} ({where}), transaction {receipt.transaction}"
        elif refused is not None or (receipt is not None and not receipt.success):
            reason = (receipt.error_reason if receipt is not None else None) or getattr(
                refused, "error", None) or "refused"
            status, note = "failed", (f"the payment of {display_usd(price)} ({where}) was refused: "
                                      f"{str(reason)[:200]}; nothing should have moved")
        else:
            status, note = "unknown", (f"the answer carries no receipt for the payment of "
                                       f"{display_usd(price)} ({where}); it counts as spent")
        await asyncio.to_thread(self.ledger.finish, row, status,  # type: ignore[arg-type]
                                tx_hash=(receipt.transaction or None) if receipt else None,
                                detail=None if status == "settled" else note[:500], charged=charged)
        log.info("%s: %s", name, note)
        day, spent = await asyncio.to_thread(self.ledger.spent_today)
        summary = (f"paywire mcp: {note}. Today (UTC {day}): {display_usd(micros_usd(spent))} of "
                   f"{display_usd(self.config.caps.per_day)}.")
        return paid.model_copy(update={
            "content": [*paid.content, types.TextContent(type="text", text=summary)]})


    # -- channels -------------------------------------------------------------------------------

    def _channel(self, node: str) -> ChannelPayer:
        channel = self._channels.get(node)
        if channel is None:
            assert self.config.keys.evm_key and self.config.channel_dir is not None
            channel = ChannelPayer(self.config.keys.evm_key, node, self.config.channel_dir)
            self._channels[node] = channel
        return channel

    def _channel_option(self, required: PaymentRequired | PaymentRequiredV1,
                        ) -> tuple[Any, ChannelPayer] | None:
        """The quote's channel option and its client, when --max-deposit allows channels."""
        config = self.config
        if config.max_deposit is None or config.channel_dir is None:
            return None
        found = channel_option(required, config.keys, config.network, config.scheme,
                               config.evm_rpc_url, lambda text: log.warning("%s", text))
        return None if found is None else (found[0], self._channel(found[1]))

    async def _pay_by_channel(self, name: str, arguments: dict[str, Any], required: PaymentRequired,
                              option: Any, channel: ChannelPayer) -> types.CallToolResult | None:
        """The call paid through the option's channel, holding its lock from reading its record to
        applying the receipt; None when the deposit it needs does not fit --max-deposit (nothing
        signed: the caller pays without a channel)."""
        config, caps = self.config, self.config.caps
        amount, network, asset = option.get_amount(), str(option.network), str(option.asset)
        price = usd_value(amount, asset, network)
        if price is None or config.max_deposit is None:
            return None  # (the caller refuses what it cannot value, in its words)
        where = f"{amount} atomic units of USDC on {network}"
        if price > caps.per_call:
            return _over_per_call(name, price, where, caps.per_call)
        validity = signed_validity(option, config.limits.max_validity_seconds)
        bounded = option.model_copy(update={"max_timeout_seconds": validity})
        extensions = identified_extensions(required)  # one id for the call, kept by a re-signing
        terms = json.dumps(option.model_dump(by_alias=True, exclude_none=True), separators=(",", ":"))
        channel_id = channel.channel_id(option)
        async with channel.locked(channel_id):
            for attempt in (1, 2):
                try:
                    view = await asyncio.to_thread(channel.prepare, option)
                    row = await asyncio.to_thread(
                        self.ledger.reserve_voucher, server=config.server_url, tool=name,
                        network=network, asset=asset, channel_id=channel_id, price_atomic=int(amount),
                        ceiling_atomic=view.ceiling, pay_to=str(option.pay_to),
                        cap_micros=usd_micros(caps.per_day), terms=terms)
                except ChannelError as exc:
                    return _result(f"paywire mcp: not paid: {exc}. Nothing was signed.")
                except OverCap as over:
                    return _over_day(name, price, where, over, caps.per_day)
                deposits = _LedgerDeposits(self.ledger, config.server_url, name, network, asset,
                                           str(option.pay_to), usd_micros(config.max_deposit))
                try:
                    signed = await asyncio.to_thread(channel.sign, required, bounded, extensions, deposits)
                except BaseException as exc:
                    for reserved in (row, deposits.row):
                        if reserved is not None:
                            await asyncio.to_thread(self.ledger.release, reserved)
                    if isinstance(exc, DepositRefused):
                        log.warning("%s: %s; paying without a channel", name, exc)
                        return None
                    if isinstance(exc, Exception):
                        log.warning("signing a channel payment for %s failed: %s", name, type(exc).__name__)
                        return _result(f"paywire mcp: not paid: the payment could not be signed "
                                       f"({type(exc).__name__}). Nothing was charged.")
                    raise
                payload = signed.model_copy(update={"accepted": option})
                rows = (row, deposits.row)
                await self._mark_signed(rows, channel.payer, validity, payload)
                paid = await self._send_paid(name, arguments, payload, validity, rows)
                if isinstance(paid, str):
                    return _result(paid)
                corrective = extract_payment_required_from_result(_as_x402(paid)) if paid.isError else None
                if attempt == 1 and needs_resync(corrective) and await asyncio.to_thread(
                        channel.resync, payload, option, corrective):
                    await self._finish(rows, "failed", "the server's running total differed: resynced")
                    log.info("%s: the channel's running total was resynced from the server's", name)
                    continue
                return await self._channel_settled(name, rows, paid, option, payload, channel, where)
        raise AssertionError("unreachable: the second attempt returns")

    async def _mark_signed(self, rows: tuple[int, int | None], payer: str, validity: int,
                           payload: PaymentPayload) -> None:
        now = utc_now()
        voucher, deposit = rows
        # (a voucher never expires: it counts for good; a deposit's authorization does)
        await asyncio.to_thread(self.ledger.mark_signed, voucher, payer=payer,
                                expires_at=expiry(now, validity, None))
        if deposit is not None:
            await asyncio.to_thread(self.ledger.mark_signed, deposit, payer=payer,
                                    expires_at=expiry(now, validity, _deposit_valid_before(payload)))

    async def _finish(self, rows: tuple[int, int | None], status: str, detail: str | None = None) -> None:
        for row in rows:
            if row is not None:
                await asyncio.to_thread(self.ledger.finish, row, status, detail=detail)  # type: ignore[arg-type]

    async def _send_paid(self, name: str, arguments: dict[str, Any], payload: PaymentPayload,
                         validity: int, rows: tuple[int, int | None]) -> types.CallToolResult | str:
        """The paid call; sent again while the server says the channel is busy with another call
        (the same payment: it was not taken). What to answer when no answer came."""
        meta = attach_payment_to_meta({"name": name, "arguments": arguments}, payload)["_meta"]
        wait = min(max(validity, 60), LONGEST_PAID_WAIT)
        limits = self.config.limits
        for send in range(1, limits.sends + 1):
            try:
                paid = await self.session.call_tool(name, arguments, meta=meta,
                                                    read_timeout_seconds=timedelta(seconds=wait))
            except Exception as exc:
                await self._finish(rows, "unknown", type(exc).__name__)
                log.warning("paid call to %s got no answer (%s): its payment counts as unknown",
                            name, type(exc).__name__)
                return (f"paywire mcp: the paid call to {name} got no answer ({type(exc).__name__}); "
                        "its voucher counts against today's cap (`paywire mcp --spent` lists it).")
            refused = extract_payment_required_from_result(_as_x402(paid)) if paid.isError else None
            if getattr(refused, "error", None) != CHANNEL_BUSY or send == limits.sends:
                return paid
            await asyncio.sleep(retry_delay(None, send, limits))  # the client's pause, then again
        raise AssertionError("unreachable: the last send returns")

    async def _channel_settled(self, name: str, rows: tuple[int, int | None], paid: types.CallToolResult,
                               option: Any, payload: PaymentPayload, channel: ChannelPayer,
                               where: str) -> types.CallToolResult:
        """Record what the answer says of a channel payment (the call's charge, the deposit's
        transaction), hand its receipt to the channel's client; the answer goes back with it."""
        answer = _as_x402(paid)
        receipt: SettleResponse | None = extract_payment_response_from_meta(answer)
        refused = extract_payment_required_from_result(answer) if paid.isError else None
        network, asset = str(option.network), str(option.asset)
        price = usd_value(option.get_amount(), asset, network) or Decimal(0)
        voucher, deposit = rows
        if receipt is not None and receipt.success:
            problem = await asyncio.to_thread(channel.settled, payload, option, receipt)
            atomic = charged_atomic(receipt, option)
            usd = None if atomic is None else usd_value(str(atomic), asset, network)
            charged = None if atomic is None or usd is None else (atomic, usd_to_atomic(usd))
            await asyncio.to_thread(self.ledger.finish, voucher, "settled", detail=problem, charged=charged)
            state = channel_state(receipt)
            note = (f"paid {display_usd(usd) if usd is not None else '?'} of at most "
                    f"{display_usd(price)} through channel {state.get('channelId', '?')} ({where}); "
                    f"its running total {state.get('chargedCumulativeAmount', '?')} of "
                    f"{state.get('balance', '?')} deposited")
            if deposit is not None:
                await asyncio.to_thread(self.ledger.finish, deposit, "settled",
                                        tx_hash=receipt.transaction or None)
                note += f"; deposited {receipt.amount} atomic units, transaction {receipt.transaction}"
        elif refused is not None or receipt is not None:
            reason = (receipt.error_reason if receipt is not None else None) or getattr(
                refused, "error", None) or "refused"
            note = (f"the channel payment ({where}) was refused: {str(reason)[:200]}; nothing should "
                    "have moved")
            await self._finish(rows, "failed", note[:500])
        else:
            note = (f"the answer carries no receipt for the channel payment ({where}); its voucher "
                    "counts as spent")
            await self._finish(rows, "unknown", note[:500])
        log.info("%s: %s", name, note)
        day, spent = await asyncio.to_thread(self.ledger.spent_today)
        held = await asyncio.to_thread(self.ledger.escrow)
        cap = self.config.max_deposit or Decimal(0)
        summary = (f"paywire mcp: {note}. Today (UTC {day}): {display_usd(micros_usd(spent))} of "
                   f"{display_usd(self.config.caps.per_day)}; in escrow "
                   f"{display_usd(micros_usd(held))} of {display_usd(cap)}.")
        return paid.model_copy(update={
            "content": [*paid.content, types.TextContent(type="text", text=summary)]})

    async def refund_channels(self) -> list[tuple[bool, str]]:
        """Each channel the ledger paid through at this server, refunded: (done, what happened)."""
        config = self.config
        known = await asyncio.to_thread(self.ledger.channels, config.server_url)
        if not known:
            return [(False, f"no channel paid through at {config.server_url} in the spend ledger "
                            f"{config.ledger_path}: nothing to refund")]
        outcomes = []
        for terms in known:
            requirement = PaymentRequirements.model_validate_json(terms.terms)
            node = evm_node(terms.network, config.evm_rpc_url)
            if node is None or not config.keys.evm_key or config.channel_dir is None:
                outcomes.append((False, f"channel {terms.channel_id}: not refunded: no EVM node is "
                                        f"known for {terms.network} (--evm-rpc names one)"))
                continue
            channel = self._channel(node)
            fetch = _McpRefund(asyncio.get_running_loop(), self.session, terms.tool,
                               await self._refund_arguments(terms.tool), requirement)
            try:
                done = await asyncio.to_thread(channel.refund, f"{config.server_url}#{terms.tool}", fetch)
            except ChannelError as exc:
                outcomes.append((False, f"channel {terms.channel_id}: not refunded: {exc}"))
                continue
            amount = int(done.amount) if (done.amount or "").isdigit() else 0
            await asyncio.to_thread(self.ledger.record_refund, server=config.server_url,
                                    network=terms.network, asset=terms.asset,
                                    channel_id=terms.channel_id, amount_atomic=amount,
                                    tx_hash=done.transaction, payer=channel.payer)
            usd = usd_value(str(amount), terms.asset, terms.network)
            outcomes.append((True, f"refunded {display_usd(usd) if usd is not None else '?'} "
                                   f"({amount} atomic units) from channel {terms.channel_id} on "
                                   f"{terms.network}, transaction {done.transaction}"))
        return outcomes

    async def _refund_arguments(self, tool: str) -> dict[str, Any]:
        """Arguments a refund's tool call carries: it buys no call, so none but the model a model
        tool needs to be routed (the first of its `model` enum)."""
        cursor = None
        for _ in range(100):
            page = await self.list_tools(cursor)
            for found in page.tools:
                if found.name == tool:
                    model = (found.inputSchema.get("properties") or {}).get("model") or {}
                    enum = model.get("enum") if isinstance(model, dict) else None
                    return {"model": enum[0]} if isinstance(enum, list) and enum else {}
            if (cursor := page.nextCursor) is None:
                break
        return {}


class _McpRefund:
    """The SDK's refund fetch over the MCP session (called from the refund's worker thread): its
    probe is answered from the channel's terms as the ledger kept them (a tool's quote needs a
    real request), its refund payment sent as a tool call's `_meta`, the tool result's receipt or
    quote read back as the headers the SDK reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: ClientSession, tool: str,
                 arguments: dict[str, Any], requirement: PaymentRequirements) -> None:
        self._loop, self._session, self._tool = loop, session, tool
        self._arguments, self._requirement = arguments, requirement

    def __call__(self, url: str, headers: dict[str, str]) -> RefundAnswer:
        signature = headers.get("PAYMENT-SIGNATURE")
        if signature is None:
            quote = PaymentRequired(accepts=[self._requirement], resource=ResourceInfo(url=url))
            return RefundAnswer(402, {"PAYMENT-REQUIRED": encode_payment_required_header(quote)})
        payload = decode_payment_signature_header(signature)
        assert isinstance(payload, PaymentPayload)
        meta = attach_payment_to_meta({"name": self._tool, "arguments": self._arguments}, payload)["_meta"]
        result = asyncio.run_coroutine_threadsafe(self._session.call_tool(
            self._tool, self._arguments, meta=meta,
            read_timeout_seconds=timedelta(seconds=REFUND_SECONDS)), self._loop).result()
        answer = _as_x402(result)
        receipt = extract_payment_response_from_meta(answer)
        refused = extract_payment_required_from_result(answer) if result.isError else None
        found: dict[str, str] = {}
        if receipt is not None:
            found["PAYMENT-RESPONSE"] = encode_payment_response_header(receipt)
        if isinstance(refused, PaymentRequired):
            found["PAYMENT-REQUIRED"] = encode_payment_required_header(refused)
            return RefundAnswer(402, found)
        if receipt is None:
            text = " ".join(i.text for i in result.content if isinstance(i, types.TextContent))
            raise ChannelError(f"the server answered the refund without a receipt: {text[:300]}")
        return RefundAnswer(200 if receipt.success else 402, found)


def _charged(receipt: SettleResponse | None, chosen: Any) -> tuple[int, int] | None:
    """An `upto` payment's charge as the receipt states it: (atomic, micro-dollars); None for
    `exact` (the whole amount) or a receipt that states no usable amount (the maximum counts)."""
    atomic = settled_atomic(receipt, chosen) if chosen.scheme == "upto" else None
    usd = None if atomic is None else usd_value(str(atomic), str(chosen.asset), str(chosen.network))
    return None if atomic is None or usd is None else (atomic, usd_to_atomic(usd))


def build_server(proxy: PayingProxy, upstream: types.InitializeResult) -> Server[Any]:
    """The stdio side: the remote's tools under the remote's name and instructions."""
    caps = proxy.config.caps
    note = (f"Tools of {proxy.config.server_url}, paid by `paywire mcp` from the user's key: at most "
            f"{display_usd(caps.per_call)} a call and {display_usd(caps.per_day)} a UTC day.")
    if proxy.config.max_deposit is not None:
        note += (f" Through payment channels where offered, with at most "
                 f"{display_usd(proxy.config.max_deposit)} in escrow.")
    instructions = f"{upstream.instructions}\n\n{note}" if upstream.instructions else note
    server: Server[Any] = Server(f"paywire mcp: {upstream.serverInfo.name}"[:200], version=VERSION,
                                 instructions=instructions)

    # Registered as request handlers, not through the SDK's decorators: those keep a tool cache
    # that costs a remote tools/list before each call to a tool of a later page, and would
    # validate what the remote validates anyway.
    async def list_tools(request: types.ListToolsRequest) -> types.ServerResult:
        params = request.params
        return types.ServerResult(await proxy.list_tools(params.cursor if params else None))

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        name = request.params.name
        try:
            result = await proxy.call_tool(name, request.params.arguments or {})
        except Exception as exc:  # the remote's refusal (an unknown tool...) or a dropped link
            result = _result(f"paywire mcp: calling {name} failed: {_reason(exc)}")
        return types.ServerResult(result)

    server.request_handlers[types.ListToolsRequest] = list_tools
    server.request_handlers[types.CallToolRequest] = call_tool
    return server


@asynccontextmanager
async def connect(config: ProxyConfig) -> AsyncIterator[tuple[PayingProxy, types.InitializeResult]]:
    """The proxy over an initialized session with the remote server, and the remote's own
    introduction. Every answer of the remote is read within the client's limits (`BoundedAnswers`)."""
    ledger = await asyncio.to_thread(SpendLedger, config.ledger_path)
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(
            timeout=httpx.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
            headers=NO_COMPRESSION, transport=BoundedAnswers(config.limits.answer_bytes)))
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(config.server_url, http_client=http))
        session = await stack.enter_async_context(ClientSession(read, write))
        upstream = await asyncio.wait_for(session.initialize(), timeout=30)
        yield PayingProxy(config, session, ledger), upstream


async def serve_stdio(config: ProxyConfig) -> None:
    """Connect to the remote server, then serve MCP on stdin/stdout until stdin closes.
    ProxyError (one line) when the remote cannot be reached, or the link to it breaks."""
    connected = False
    try:
        async with connect(config) as (proxy, upstream):
            connected = True
            log.info("connected to %s (%s); caps %s a call, %s a day, %s in channels' escrow; "
                     "ledger %s", config.server_url, upstream.serverInfo.name,
                     display_usd(config.caps.per_call), display_usd(config.caps.per_day),
                     display_usd(config.max_deposit) if config.max_deposit is not None else "none",
                     config.ledger_path)
            server = build_server(proxy, upstream)
            async with stdio_server() as (stdin, stdout):
                await server.run(stdin, stdout, server.create_initialization_options())
    except Exception as exc:  # the transport's task group raises what broke it: one line, no traceback
        what = "lost the connection to" if connected else "cannot reach"
        raise ProxyError(f"{what} the MCP server at {config.server_url}: {_reason(exc)}") from None


async def refund_channels(config: ProxyConfig) -> list[tuple[bool, str]]:
    """Connect to the remote server and refund the channels paid through there: (done, what
    happened) for each. ProxyError (one line) when the remote cannot be reached."""
    try:
        async with connect(config) as (proxy, _):
            return await proxy.refund_channels()
    except Exception as exc:  # the transport's task group raises what broke it: one line
        raise ProxyError(f"cannot refund through the MCP server at {config.server_url}: "
                         f"{_reason(exc)}") from None


class BoundedAnswers(httpx.AsyncBaseTransport):
    """The remote's answers, one message at most `limit` bytes, never compressed
    (payments/client_limits.py). The MCP SDK reads a JSON answer whole and an SSE stream event by
    event, and, when a read fails, leaves the request waiting out its timeout: so an answer over
    the limit is turned into a JSON-RPC error for its request (a JSON answer: in its place; an
    SSE event: ending the stream), and the tool call answers at once, naming the limit."""

    def __init__(self, limit: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        streamed = response.headers.get("Content-Type", "").lower().startswith("text/event-stream")
        try:
            if streamed:
                refuse_compressed(response.headers)
                events = _BoundedEvents(response, self._limit, request)
                return httpx.Response(response.status_code, headers=response.headers, stream=events,
                                      extensions=response.extensions)
            body = await read_bounded(response, self._limit)
        except AnswerTooLarge as exc:
            await response.aclose()
            request_id = _request_id(request)
            if request_id is None:
                raise
            return httpx.Response(200, json=_refusal(request_id, exc))
        await response.aclose()
        return httpx.Response(response.status_code, headers=response.headers, content=body,
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedEvents(httpx.AsyncByteStream):
    """An SSE stream passed on an event at a time, each at most `limit` bytes; the first over it
    is dropped, and the stream ends with a JSON-RPC error event for the request it answers (when
    it answers one): the SDK never parses half an event."""

    _BLANK_LINES = (b"\n\n", b"\r\r", b"\r\n\r\n")  # where an event ends

    def __init__(self, response: httpx.Response, limit: int, request: httpx.Request) -> None:
        self._response = response
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = bytearray()  # the event being received
        async for chunk in self._response.aiter_raw():
            searched = max(len(held) - 3, 0)  # a blank line may straddle two chunks
            held += chunk
            found = [(held.rfind(blank, searched), len(blank)) for blank in self._BLANK_LINES]
            end = max((at + size for at, size in found if at >= 0), default=0)
            if end:
                yield bytes(held[:end])
                del held[:end]
            if len(held) > self._limit:
                request_id = _request_id(self._request)
                if request_id is not None:
                    error = _refusal(request_id, AnswerTooLarge(
                        f"an event of the answer is over the client's limit of {mib(self._limit)}"))
                    yield b"event: message\r\ndata: " + json.dumps(error).encode() + b"\r\n\r\n"
                return
        if held:
            yield bytes(held)

    async def aclose(self) -> None:
        await self._response.aclose()


def _request_id(request: httpx.Request) -> Any:
    """The JSON-RPC id of the request an answer is for (None: a notification, or a GET)."""
    try:
        message = json.loads(request.content) if request.method == "POST" else None
    except (ValueError, httpx.RequestNotRead):
        return None
    return message.get("id") if isinstance(message, dict) else None


def _refusal(request_id: Any, exc: AnswerTooLarge) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": -32603, "message": f"paywire mcp: the server's answer was not read: {exc}"}}


def _reason(exc: BaseException) -> str:
    """The innermost cause of a connection failure (anyio wraps them in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]


def configure_logging(level: str = "warning") -> None:
    """Logs on stderr (stdout is the MCP channel); the libraries' request logs kept quiet."""
    logging.basicConfig(level=logging.WARNING, format="paywire mcp: %(levelname)s %(message)s")
    log.setLevel(level.upper())
    for noisy in ("httpx", "x402"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for chatty in ("mcp", "client"):  # the MCP SDK's (its client session logs as "client")
        logging.getLogger(chatty).setLevel(logging.ERROR)
