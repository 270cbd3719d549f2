"""A payer's mistakes, explained: what went wrong and what to do, in the words a client shows.

Four mistakes that otherwise get a bare answer (issue 22 §4):

- An underfunded payer. The facilitator's verify answers `invalid_exact_evm_insufficient_balance`
  (EVM) or `transaction_simulation_failed` (Solana, whatever made the simulation fail). The
  reason code stays as the SDK gave it (clients key on it); the message gets the payer's USDC
  balance, read over the chain's RPC (the one the reconciler asks, bounded by
  `BALANCE_READ_SECONDS`), beside the call's price, and how to fund the payer (the devnet's
  faucet when there is one). Solana's code says "insufficient balance" only when the balance
  read proves it; otherwise it names the likely causes. A balance that cannot be read is said
  to be unread, never guessed.
- A Permit2 payment (`exact` by Permit2, `upto`, a channel's Permit2 deposit) from a payer who has
  not approved Permit2 for the token: the facilitator's `permit2_allowance_required` (or the
  batch-settlement one). The message gets the payer's allowance for Permit2 (read as a balance
  is) beside what the payment needs, and what to do: approve the canonical Permit2 for the token,
  or sign the gasless approval of x402's gas-sponsoring extensions when the quote offers one.
- A payment in a header paywire does not read (`Authorization`, `X-Payment-Signature`,
  `PAYMENT-RESPONSE`...): a 402 whose message names the header and the two it reads. Only a
  few values of a plausible size and alphabet are decoded (`MAX_INSPECTED_VALUES`), each
  through the codec's bounded reader.
- A client that does not pay with x402 at all (the `openai` package without an x402 transport):
  `how_to_pay` is the 402's message saying how (the header, the price, where the quote is).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from eth_utils import function_abi_to_4byte_selector
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction
from x402.extensions.eip2612_gas_sponsoring import EIP2612_GAS_SPONSORING_KEY as EIP2612_SPONSORING
from x402.extensions.erc20_approval_gas_sponsoring import (
    ERC20_APPROVAL_GAS_SPONSORING_KEY as ERC20_SPONSORING,
)
from x402.mechanisms.evm import constants as evm
from x402.mechanisms.evm.batch_settlement import errors as batch
from x402.mechanisms.svm import constants as svm
from x402.mechanisms.svm.utils import derive_ata, extract_transaction_info
from x402.schemas import PaymentRequired, PaymentRequirements

from .chain_probe import JsonRpc, ProbeError, UnexpectedAnswer
from .codec import PAYMENT_HEADERS, SIWX_HEADER, PaymentHeaderError, decode_payment_header
from .money import USDC_DECIMALS, atomic_to_usd, usd_text
from .networks import NetworkInfo, lookup_network

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- an underfunded payer

BALANCE_READ_SECONDS = 2.0  # the refusal waits at most this long for the payer's balance
UNDERFUNDED_EVM = frozenset({evm.ERR_INSUFFICIENT_BALANCE, evm.ERR_PERMIT2_INSUFFICIENT_BALANCE})
SIMULATION_FAILED = svm.ERR_SIMULATION_FAILED
# A Permit2 payment whose payer has not approved Permit2 for the token (`exact`, `upto`), or a
# channel's Permit2 deposit: the facilitator read the allowance and found it short (or unreadable)
PERMIT2_UNAPPROVED = frozenset({evm.ERR_PERMIT2_ALLOWANCE_REQUIRED,
                                batch.ERR_PERMIT2_ALLOWANCE_REQUIRED})
_BALANCE_OF = "70a08231"  # ERC-20 balanceOf(address)
_ALLOWANCE = function_abi_to_4byte_selector(evm.ERC20_ALLOWANCE_ABI[0]).hex()  # (owner, spender)
_WORD = re.compile(r"0x[0-9a-fA-F]{64}")
_TOKEN_PROGRAMS = frozenset({svm.TOKEN_PROGRAM_ADDRESS, svm.TOKEN_2022_PROGRAM_ADDRESS})
_TOKEN_ACCOUNT_HEAD = 109  # an SPL token account's mint, owner, amount, delegate and state
_FROZEN = 2  # an SPL token account's state byte (offset 108): 0 uninitialized, 1 initialized

RpcFor = Callable[[str], JsonRpc | None]  # CAIP-2 network -> the RPC its chain is read through


@dataclass(frozen=True)
class Holding:
    """What the chain says the payer can pay with: the debited account's USDC (atomic units);
    `account` names a Solana token account, `missing` when it does not exist (it holds nothing),
    `frozen` when its owner cannot move it."""

    amount: int
    account: str | None = None
    missing: bool = False
    frozen: bool = False


class PayerMistakes:
    """Explains the refusals of an underfunded payer, reading balances through `rpc_for` (None,
    or a network it has no RPC for: the refusal says what its code means, without figures).
    `faucet_url`: the devnet's faucet (POST {network, address, amount}), when there is one."""

    def __init__(self, rpc_for: RpcFor | None = None, *, faucet_url: str | None = None,
                 timeout: float = BALANCE_READ_SECONDS) -> None:
        self._rpc_for = rpc_for
        self._faucet_url = faucet_url
        self._timeout = timeout

    async def explain(self, reason: str, payload: Mapping[str, Any],
                      requirement: PaymentRequirements) -> str | None:
        """What a facilitator's refusal `reason` of this matched scheme `payload` means and how
        the payer fixes it, or None when it is not an underfunded payer's code (nor a missing
        Permit2 approval's)."""
        network = lookup_network(requirement.network)
        if network.family == "evm" and reason in UNDERFUNDED_EVM:
            return await self._evm(payload, requirement, network)
        if network.family == "evm" and reason in PERMIT2_UNAPPROVED:
            return await self._permit2(payload, requirement, network)
        if network.family == "svm" and reason == SIMULATION_FAILED:
            return await self._svm(payload, requirement, network)
        return None

    async def _evm(self, payload: Mapping[str, Any], requirement: PaymentRequirements,
                   network: NetworkInfo) -> str:
        payer = str(payload["authorization"]["from"])
        holding, unread = await self._read(network, _evm_balance(requirement.asset, payer))
        cost = int(requirement.amount)
        if holding is None:
            return (f"the facilitator found that the payer {payer} holds less USDC on "
                    f"{_name(network)} than the call's {_usdc(cost)} ({unread}); "
                    f"{self._fund(network, payer, cost)}")
        return (f"the payer {payer} holds {_usdc(holding.amount)} on {_name(network)}, the call "
                f"costs {_usdc(cost)}; {self._fund(network, payer, cost - holding.amount)}")

    async def _permit2(self, payload: Mapping[str, Any], requirement: PaymentRequirements,
                       network: NetworkInfo) -> str:
        token, spend = str(requirement.asset), _permit2_spend(payload, requirement)
        approve = (f"approve Permit2 ({evm.PERMIT2_ADDRESS}) for the token {token} once (the "
                   f"token's approve({evm.PERMIT2_ADDRESS}, amount), sent from the payer, its gas "
                   "paid in ETH), or sign the gasless approval of x402's "
                   f"{EIP2612_SPONSORING} or {ERC20_SPONSORING} extension when the quote offers "
                   "one; then send the same request again. Nothing was charged")
        if spend is None:  # (the facilitator read this payload; a payload it did not: no figures)
            return f"the payer has not approved Permit2 to move its tokens; {approve}"
        owner, need, what = spend
        holding, unread = await self._read(network, _evm_allowance(token, owner), "allowance")
        if holding is None:
            return (f"the facilitator found that the payer {owner} has not approved Permit2 to "
                    f"move {_token_amount(need, token, network)} for {what} on {_name(network)} "
                    f"({unread}); {approve}")
        if holding.amount >= need:  # approved since the facilitator read, or its read failed
            return (f"the payer {owner}'s allowance for Permit2 is "
                    f"{_token_amount(holding.amount, token, network)} now, enough for {what} "
                    f"({_token_amount(need, token, network)}); the facilitator read less or "
                    "could not read it: send the same request again. Nothing was charged")
        return (f"the payer {owner} has not approved Permit2 for the token on {_name(network)}: "
                f"its allowance for Permit2 is {_token_amount(holding.amount, token, network)}, "
                f"{what} needs {_token_amount(need, token, network)}; {approve}")

    async def _svm(self, payload: Mapping[str, Any], requirement: PaymentRequirements,
                   network: NetworkInfo) -> str:
        info = extract_transaction_info(VersionedTransaction.from_bytes(
            base64.b64decode(str(payload["transaction"]))))
        if info is None:  # no transfer to read a balance for
            return _simulation_causes(None)
        cost = int(requirement.amount)
        holding, unread = await self._read(network, _svm_balance(info.source_ata, info.mint))
        if holding is None:
            return (f"the facilitator's simulation of the transaction failed; {unread}, so the "
                    f"likely causes are: the payer {info.payer} holds less than the call's "
                    f"{_usdc(cost)} on {_name(network)} ({self._fund(network, info.payer, cost)}), "
                    f"or {_simulation_causes(None)}")
        if holding.amount >= cost:
            return (f"the facilitator's simulation of the transaction failed, though the token "
                    f"account it debits ({holding.account}) holds {_usdc(holding.amount)}, enough "
                    f"for the call's {_usdc(cost)}; the likely causes: {_simulation_causes(holding)}")
        where = (f"its token account {holding.account} does not exist" if holding.missing
                 else f"in {holding.account}, the token account the transfer debits")
        return (f"insufficient balance: the payer {info.payer} holds {_usdc(holding.amount)} on "
                f"{_name(network)}, {where}; the call costs {_usdc(cost)}; "
                f"{self._fund(network, info.payer, cost - holding.amount)}")

    async def _read(self, network: NetworkInfo, reading: Reading,
                    what: str = "balance") -> tuple[Holding | None, str]:
        """The holding `reading` finds on `network`'s chain, or None and why not (`what` the
        payer's it reads: its balance, its allowance)."""
        rpc = self._rpc_for(network.caip2) if self._rpc_for is not None else None
        if rpc is None:
            return None, f"this gateway has no RPC to read {what}s on {network.caip2}"
        try:
            async with asyncio.timeout(self._timeout):
                return await reading(rpc), ""
        except TimeoutError:
            return None, f"the payer's {what} could not be read within {self._timeout:g} s"
        except (ProbeError, ValueError) as exc:
            return None, f"the payer's {what} could not be read ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - an explanation never turns a refusal into a 500
            log.warning("reading a payer's %s failed: %s", what, type(exc).__name__)
            return None, f"the payer's {what} could not be read ({type(exc).__name__})"

    def _fund(self, network: NetworkInfo, payer: str, shortfall: int) -> str:
        """How the payer gets the USDC it lacks, then what to send."""
        if self._faucet_url is None:
            how = f"fund the payer {payer} with USDC on {_name(network)}"
        else:
            amount = max(shortfall, 1)
            how = (f"fund the payer (on this devnet: POST {self._faucet_url} with "
                   f'{{"network": "{network.caip2}", "address": "{payer}", "amount": {amount}}}, '
                   "atomic units)")
        return f"{how} and send the same request again"


Reading = Callable[[JsonRpc], Awaitable[Holding]]


def _evm_balance(token: str, owner: str) -> Reading:
    async def read(rpc: JsonRpc) -> Holding:
        data = "0x" + _BALANCE_OF + owner.lower().removeprefix("0x").rjust(64, "0")
        answer = await rpc.call("eth_call", [{"to": token, "data": data}, "latest"])
        if not isinstance(answer, str) or not _WORD.fullmatch(answer):
            raise UnexpectedAnswer("eth_call balanceOf: not one ABI word")
        return Holding(int(answer, 16))
    return read


def _evm_allowance(token: str, owner: str) -> Reading:
    """`token.allowance(owner, Permit2)` at the latest block."""
    async def read(rpc: JsonRpc) -> Holding:
        words = (a.lower().removeprefix("0x").rjust(64, "0") for a in (owner, evm.PERMIT2_ADDRESS))
        data = "0x" + _ALLOWANCE + "".join(words)
        answer = await rpc.call("eth_call", [{"to": token, "data": data}, "latest"])
        if not isinstance(answer, str) or not _WORD.fullmatch(answer):
            raise UnexpectedAnswer("eth_call allowance: not one ABI word")
        return Holding(int(answer, 16))
    return read


def _permit2_spend(payload: Mapping[str, Any],
                   requirement: PaymentRequirements) -> tuple[str, int, str] | None:
    """Who must have approved Permit2, for how much (what the facilitator checks the allowance
    against) and for what: a channel's deposit, its amount; an `exact` or `upto` permit, the
    requirement's amount. None when the payload does not say."""
    try:
        if "deposit" in payload:
            return (str(payload["channelConfig"]["payer"]), int(payload["deposit"]["amount"]),
                    "the channel's deposit")
        return str(payload["permit2Authorization"]["from"]), int(requirement.amount), "the call"
    except (KeyError, TypeError, ValueError):
        return None


def _token_amount(atomic: int, token: str, network: NetworkInfo) -> str:
    """USDC as USDC; another token (a Permit2 deposit's may be any ERC-20) in its atomic units."""
    if token.lower() == network.usdc.lower():
        return _usdc(atomic, network.decimals)
    return f"{atomic} atomic units of {token}"


def _svm_balance(account: str, mint: str) -> Reading:
    async def read(rpc: JsonRpc) -> Holding:
        answer = await rpc.call("getAccountInfo", [account, {
            "encoding": "base64", "commitment": "confirmed",
            "dataSlice": {"offset": 0, "length": _TOKEN_ACCOUNT_HEAD}}])
        if not isinstance(answer, dict) or "value" not in answer:
            raise UnexpectedAnswer("getAccountInfo: no value")
        value = answer["value"]
        if value is None:  # no such account: it holds nothing
            return Holding(0, account, missing=True)
        head = _account_data(value)
        if value.get("owner") not in _TOKEN_PROGRAMS or str(Pubkey(head[:32])) != mint:
            raise UnexpectedAnswer(f"{account} is not a token account of {mint}")
        return Holding(int.from_bytes(head[64:72], "little"), account,
                       frozen=head[108] == _FROZEN)
    return read


def _account_data(value: Any) -> bytes:
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, list) or len(data) != 2 or data[1] != "base64":
        raise UnexpectedAnswer("getAccountInfo: no base64 data")
    try:
        head = base64.b64decode(str(data[0]), validate=True)
    except (binascii.Error, ValueError):
        raise UnexpectedAnswer("getAccountInfo: data is not base64") from None
    if len(head) < _TOKEN_ACCOUNT_HEAD:
        raise UnexpectedAnswer("getAccountInfo: shorter than a token account")
    return head


def _simulation_causes(holding: Holding | None) -> str:
    """Why a Solana payment's simulation fails when its balance is not the reason (or unknown)."""
    if holding is not None and holding.frozen:
        return (f"the token account {holding.account} is frozen: pay from another account")
    return ("the transaction's recent blockhash expired or is unknown to the chain (sign a new "
            "payment), the payer's token account is frozen, or the transaction holds an "
            "instruction the chain refuses; sign a new payment and send the request again")


def _usdc(atomic: int, decimals: int = USDC_DECIMALS) -> str:
    return f"{usd_text(atomic_to_usd(atomic, decimals))} USDC"


def _name(network: NetworkInfo) -> str:
    return f"{network.label or network.v1_name} ({network.caip2})"


# ---------------------------------------------------------------------- a payment in the wrong header

MISPLACED_PAYMENT = "payment_header_not_read"  # the 402's reason
MIN_PAYMENT_CHARS = 200  # the smallest x402 payment is ~500 characters of base64
MAX_INSPECTED_VALUES = 4  # candidate values decoded per request, at most
_NOT_PAYMENTS = frozenset({"cookie", "host", "user-agent", "accept", "content-type",
                           SIWX_HEADER.lower(), *(name.lower() for name in PAYMENT_HEADERS)})
# an optional auth scheme ("Bearer", "x402"...), then one base64 token (standard or URL-safe)
_CANDIDATE = re.compile(r"(?:[A-Za-z0-9_-]{1,20} +)?([A-Za-z0-9+/_=-]+)")
_MAX_CHARS = 16 * 1024 + 32


@dataclass(frozen=True)
class Misplaced:
    """A header paywire does not read that carries an x402 payment, and what to do instead."""

    header: str
    message: str


def misplaced_payment(headers: Mapping[str, str]) -> Misplaced | None:
    """The first header (other than the two payment headers) whose value decodes as an x402
    payment, or None. Only values of a payment's size and base64 alphabet are decoded, and at
    most `MAX_INSPECTED_VALUES` of them: a request's other headers cost a length check."""
    tried = 0
    for name, value in headers.items():
        if not MIN_PAYMENT_CHARS <= len(value) <= _MAX_CHARS or name.lower() in _NOT_PAYMENTS:
            continue
        found = _CANDIDATE.fullmatch(value.strip())
        if found is None:
            continue
        tried += 1
        try:
            payment = decode_payment_header(found.group(1), name)
        except PaymentHeaderError:
            payment = None
        if payment is not None:
            version = payment.x402_version
            right = PAYMENT_HEADERS[0] if version == 2 else PAYMENT_HEADERS[1]
            name = "-".join(word.capitalize() for word in name.split("-"))  # as a client wrote it
            return Misplaced(name, (
                f"the payment was sent in header {name}, which this gateway does not read; send "
                f"it in {PAYMENT_HEADERS[0]} (x402 v2) or {PAYMENT_HEADERS[1]} (x402 v1): this one "
                f"is x402 v{version}, so {right}. Nothing was charged; the same signed payment "
                "may be sent again in the right header"))
        if tried >= MAX_INSPECTED_VALUES:
            return None
    return None


# ---------------------------------------------------------------------- a client that does not pay

X402_DOCS = "https://x402.org"


def how_to_pay(required: PaymentRequired) -> str:
    """A 402's message to a client that does not speak x402 (the `openai` package without an
    x402 transport shows it as the error): the price, where the quote is, which header pays."""
    # (a network offering exact and upto is one place to pay, at one price: named once)
    options = list(dict.fromkeys(_option(r) for r in required.accepts))
    prices = ("; or ".join(f"{usdc} on {where}" for usdc, where in options)
              if len({usdc for usdc, _ in options}) != 1 else
              f"{options[0][0]} (on {' or '.join(where for _, where in options)})")
    origin = urlsplit(required.resource.url) if required.resource is not None else None
    page = f" and {origin.scheme}://{origin.netloc}/ (this gateway's catalogue: prices, " \
           "copy-paste programs)" if origin is not None and origin.netloc else ""
    return (f"Payment required: this call costs {prices}. Pay it with x402: sign one option of the "
            "quote (the PAYMENT-REQUIRED response header, base64 JSON, x402 v2; or this body's "
            "`accepts`, x402 v1) and send the same request again with the payment in the "
            "PAYMENT-SIGNATURE header (x402 v2) or X-PAYMENT (x402 v1). With the openai "
            "package, give it http_client=httpx.AsyncClient(transport=x402AsyncTransport(payer)) "
            f"from the x402 SDK, which does this on its own. Docs: {X402_DOCS}{page}")


def _option(requirement: PaymentRequirements) -> tuple[str, str]:
    """An option of a quote: its price and where it is paid."""
    try:
        network = lookup_network(requirement.network)
    except ValueError:
        return f"{requirement.amount} atomic units of {requirement.asset}", requirement.network
    return _usdc(int(requirement.amount), network.decimals), _name(network)


async def usdc_held(rpc: JsonRpc, network: NetworkInfo, owner: str) -> int:
    """What `owner` holds of `network`'s USDC (atomic), read from the chain (a Solana owner's
    associated token account; none: 0). ProbeError when the chain cannot be read."""
    if network.family == "evm":
        return (await _evm_balance(network.usdc, owner)(rpc)).amount
    account = derive_ata(owner, network.usdc)
    return (await _svm_balance(account, network.usdc)(rpc)).amount
