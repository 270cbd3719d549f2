"""What became of a settlement whose outcome is unknown: ask the chain (issue 11).

A ledger row is `pending` when its settlement may or may not have reached the chain (a crash
after broadcasting, a facilitator timeout, a receipt that did not come in time). The reconciler
hands the row's `chain_ref` (written before anything was broadcast, see
`payments.processor.identify`) to `probe`, which answers one of:

- `Moved`: the money moved (with the transaction's id when it was found);
- `CannotMove`: provably nothing moved, and nothing ever can with this authorization or message;
- `StillOpen`: it may still move; ask again later.

Whatever cannot be read (a transport error, an RPC error answer, an answer of the wrong shape)
raises `ProbeError`: the probe never guesses, the reconciler logs it and asks again later. A
malformed `chain_ref` raises `InvalidChainRef` (a bug, not a transient fault).

EVM (EIP-3009): the head block is read first (number, timestamp), then `authorizationState` AT
THAT BLOCK. Unused at a block whose timestamp is >= validBefore means never: later blocks never
have smaller timestamps, and `transferWithAuthorization` requires `block.timestamp < validBefore`.
Reading the state at the same block (not at "latest" again) keeps a load-balanced RPC whose second
answer comes from a lagging node from pairing a new timestamp with an old state. A used nonce is
`Moved` unless the token's `AuthorizationCanceled` event shows the signer cancelled it
(`authorizationState` is true for both); the transaction is found through the given hash's receipt
or the token's `AuthorizationUsed(authorizer, nonce)` log within `log_lookback_blocks`, and a use
older than that is `Moved(None)`.

EVM `upto` (Permit2, chain_ref kind "permit2"): the same discipline with Permit2's
`nonceBitmap(owner, nonce >> 8)` bit `nonce & 0xff`, read at the head block. Unset at a block
stamped after the deadline means never (`permitWitnessTransferFrom` reverts only when
`block.timestamp > deadline`: a block stamped the deadline itself may still take it). A set bit is
a use or the owner's `invalidateUnorderedNonces`. A use is our settlement: the given hash's
successful receipt paying `to` from `owner` (the token's Transfer; the proxy refuses a zero
amount), or, within `log_lookback_blocks`, such a Transfer whose transaction calls the upto proxy
(`spender`) with this owner and nonce: `Moved`. Otherwise an `UnorderedNonceInvalidation`
covering the bit, with the bit still unset the block before it (state read at that block: an
invalidation older than the node's state history is no answer, and asked again) and no
unattributed Transfer to the payee ahead of it in its block, is `CannotMove`; anything else
(spent before the searched blocks) is `Moved(None)`. A zero-amount settlement sends nothing: the
pipeline records it settled with no transaction, and this probe never sees it.

A channel deposit through Permit2 (kind "permit2" with a `channel_id`, the permit's witness) is
probed the same way: its spender is the Permit2 deposit collector, which the batch-settlement
contract calls from `deposit(config, amount, collector, collectorData)`, and Permit2 transfers
the deposit from `owner` to that contract (`to`). Its use is a successful `deposit` transaction
naming this collector, owner and nonce (collectorData begins with the nonce). It names no
facilitator: anyone holding the signed deposit may submit it, as an EIP-3009 one.

Solana: `isBlockhashValid` first, then the signature's status (with history). A blockhash seen
invalid BEFORE the status lookup cannot take a transaction after it, so "not found" then means
never. Commitment is "confirmed" throughout: a transaction seen only at "processed" may still be
dropped with its fork (`StillOpen`), while a "finalized" search could miss one confirmed in the
blockhash's last slots. Without a signature (a remote facilitator that crashed before telling its
id) the debited token account's history is searched, once the blockhash has expired, for a
transaction whose message hashes to `message_hash`.

Precondition for the caller: probe a row only some time (a minute is plenty) after its payment
was signed. A node that has not yet seen a very fresh blockhash also calls it invalid.

EVM, before validBefore (`probe_our_sends`, `probe_nonce_reached`; issue 22): when the facilitator
is in process, its key is ours, and "nothing moved, nothing can" is provable well before the
authorization expires. Every transaction that could use the authorization was sent by our signers
from that key (a third party who holds the signed payment could submit it too, which a released
payment allows anyway: "the same signed payment may be sent again"). With the key's send lock
held (no send of ours is between its nonce read and the node's answer) and no settlement of the
payment able to begin a send any more (payments/broadcast_trace.py's send window), every such
transaction is in the node's pool or on chain. So: the authorization unused at block B, and the
key's nonce mined at B equal to its "pending" count, means none is waiting and none can come. If
some of the key's transactions wait (a busy key), their nonces are below the pending count: once
the key's mined nonce reaches it, every one of them is mined (or its nonce used by another), and
an authorization still unused then was used by none. A transaction the settlement named that the
node no longer knows (dropped) proves nothing: whoever holds it could send it again while its nonce
is free, so that payment waits for validBefore. What stays assumed: the node asked holds the
key's pool (not a load balancer that may answer "pending" from a node that never saw our sends),
and a transaction it took and dropped before its id reached the ledger (its replica died within a
second of sending it) is not sent again by someone else before the key's next transaction uses
its nonce.
A permit (`upto`) makes this stronger: its witness names the facilitator and the upto proxy takes
the settlement from that address alone, so the third party above cannot submit it at all, and
every transaction that can use it is one of the key's. The proof applies only when that address
is the in-process facilitator's key (another account's sends are not in sight: its deadline).
Solana has no such early point: a transaction sent to a node is forwarded and retried by it until
its blockhash expires, and no RPC tells that nothing is in flight; the blockhash is the bound.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx
from eth_utils import function_abi_to_4byte_selector, keccak
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS
from x402.mechanisms.evm.constants import (
    PERMIT2_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ABI,
    X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
)

# EIP-3009: authorizationState(address,bytes32) and its two events.
AUTHORIZATION_STATE_SELECTOR = "e94a0102"
AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"
AUTHORIZATION_CANCELED_TOPIC = "0x1cdd46ff242716cdaa72d159d339a485b3438398348d68f09d7c8c0a59353d81"
# Permit2 (SignatureTransfer): nonceBitmap(address,uint256), UnorderedNonceInvalidation(owner,
# word, mask); the token's Transfer; the upto proxy's two entry points, each to the word where its
# permit begins (settleWithPermit's EIP-2612 permit comes first: 5 words).
PERMIT2 = PERMIT2_ADDRESS.lower()
NONCE_BITMAP_SELECTOR = keccak(text="nonceBitmap(address,uint256)")[:4].hex()
UNORDERED_NONCE_INVALIDATION_TOPIC = "0x" + keccak(
    text="UnorderedNonceInvalidation(address,uint256,uint256)").hex()
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
_SETTLE_PERMIT_WORD = {
    function_abi_to_4byte_selector(entry).hex(): 5 if entry["name"] == "settleWithPermit" else 0
    for entry in (*X402_UPTO_PERMIT2_PROXY_ABI, *X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI)
    if entry.get("type") == "function" and entry["name"] in ("settle", "settleWithPermit")
}
# A channel deposit: the batch-settlement contract's deposit(config, amount, collector,
# collectorData); its config (7 static words) begins with the payer.
BATCH_SETTLEMENT = BATCH_SETTLEMENT_ADDRESS.lower()
_DEPOSIT_SELECTOR = next(function_abi_to_4byte_selector(entry).hex() for entry in BATCH_SETTLEMENT_ABI
                         if entry.get("type") == "function" and entry["name"] == "deposit")
_DEPOSIT_COLLECTOR_WORD, _DEPOSIT_DATA_WORD = 8, 9

DEFAULT_LOG_LOOKBACK_BLOCKS = 10_000  # ~5.5 hours of Base's 2 s blocks; many RPCs cap ranges near it
SIGNATURES_PAGE = 1_000  # getSignaturesForAddress's maximum page
DEFAULT_MAX_HISTORY_PAGES = 10
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_FETCH_CONCURRENCY = 16  # getTransaction calls in flight while searching a history page
_COMMITMENT = "confirmed"

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_BYTES32 = re.compile(r"0x[0-9a-fA-F]{64}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_QUANTITY = re.compile(r"0x[0-9a-fA-F]{1,64}")


# ---------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Moved:
    """The money moved; `transaction` is its id when it was found."""

    transaction: str | None


@dataclass(frozen=True)
class CannotMove:
    """Provably nothing moved, and nothing can move with this authorization or message any more."""

    reason: str


@dataclass(frozen=True)
class StillOpen:
    """Nothing has moved yet, but it still may: ask again later."""

    reason: str


@dataclass(frozen=True)
class Draining(StillOpen):
    """Nothing moved yet, and transactions of the facilitator's key wait in the node's pool:
    once the key's mined nonce reaches `nonce`, all of them are mined (or their nonces used), and
    an authorization still unused then cannot be moved by any of them (`probe_nonce_reached`)."""

    nonce: int = 0


Verdict = Moved | CannotMove | StillOpen


class ProbeError(Exception):
    """The chain could not be asked, or answered something unusable: no verdict, retry later."""


class RpcError(ProbeError):
    """The node answered the call with a JSON-RPC error."""

    def __init__(self, method: str, code: Any, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class RpcUnavailable(ProbeError):
    """The call did not get an answer (connection, timeout, HTTP status without an RPC error)."""


class UnexpectedAnswer(ProbeError):
    """The node answered, but not in the shape the method's answer has."""


class InvalidChainRef(ValueError):
    """The ledger row's chain reference (or transaction id) is malformed."""


# ---------------------------------------------------------------------- transports


class JsonRpc(Protocol):
    """One JSON-RPC call: the result, or an exception (`ProbeError` for RPC and transport faults)."""

    async def call(self, method: str, params: list[Any]) -> Any: ...


class HttpJsonRpc:
    """JSON-RPC over HTTP POST, on one pooled `httpx.AsyncClient` (close it with `aclose`)."""

    def __init__(self, url: str, *, timeout: float = 10.0,
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self._url = url
        self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        self._max_response_bytes = max_response_bytes
        self._next_id = 0

    def __repr__(self) -> str:
        # Provider URLs often carry an API key in the path or query: show the origin only.
        parsed = httpx.URL(self._url)
        return f"HttpJsonRpc({parsed.scheme}://{parsed.host}{f':{parsed.port}' if parsed.port else ''})"

    async def call(self, method: str, params: list[Any]) -> Any:
        self._next_id += 1
        request_id = self._next_id
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            async with self._client.stream("POST", self._url, json=body) as response:
                raw = await self._read(method, response)
                status = response.status_code
        except httpx.HTTPError as exc:
            # Named by type only: the URL (a provider's, with its key) stays out of the message.
            raise RpcUnavailable(f"{method}: {type(exc).__name__}") from exc
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            raise _rpc_error(method, answer["error"])
        if status != 200:
            raise RpcUnavailable(f"{method}: HTTP {status}")
        if not isinstance(answer, dict) or "result" not in answer:
            raise UnexpectedAnswer(f"{method}: not a JSON-RPC answer")
        if answer.get("id") != request_id:
            raise UnexpectedAnswer(f"{method}: the answer's id is not the call's")
        return answer["result"]

    async def _read(self, method: str, response: httpx.Response) -> bytes:
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self._max_response_bytes:
                raise UnexpectedAnswer(f"{method}: answer larger than {self._max_response_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> HttpJsonRpc:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class InProcessRpc:
    """A devnet chain's `rpc(method, params) -> {"result"} | {"error"}`, called in a worker thread.

    py-evm and LiteSVM calls block (and take the chain's lock), so they stay off the event loop.
    Params and answers go through JSON, so the probe sees exactly what an HTTP client would.
    """

    def __init__(self, rpc: Callable[[str, list[Any]], Mapping[str, Any]]) -> None:
        self._rpc = rpc

    async def call(self, method: str, params: list[Any]) -> Any:
        wire = json.loads(json.dumps(params))
        answer = json.loads(json.dumps(await asyncio.to_thread(self._rpc, method, wire)))
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            raise _rpc_error(method, answer["error"])
        if not isinstance(answer, dict) or "result" not in answer:
            raise UnexpectedAnswer(f"{method}: not a JSON-RPC answer")
        return answer["result"]


def _rpc_error(method: str, error: Mapping[str, Any]) -> RpcError:
    return RpcError(method, error.get("code"), str(error.get("message", "")), error.get("data"))


# ---------------------------------------------------------------------- the probe


async def probe(
    chain_ref: Mapping[str, Any],
    rpc: JsonRpc,
    *,
    tx_hash: str | None = None,
    log_lookback_blocks: int = DEFAULT_LOG_LOOKBACK_BLOCKS,
    max_history_pages: int = DEFAULT_MAX_HISTORY_PAGES,
    now: float | None = None,
) -> Verdict:
    """Ask the chain what became of the settlement `chain_ref` describes.

    `tx_hash` is the ledger row's transaction id when one is known (EVM: a hint where to find the
    transaction; Solana: the signature, when `chain_ref` has none). `log_lookback_blocks` bounds
    the EVM log search for the transaction; `max_history_pages` bounds the Solana history search
    (pages of 1,000 signatures) before it answers `StillOpen` instead of concluding. `now`
    (default: this machine's clock) lets an EIP-3009 authorization (a Permit2 permit) expire on a
    chain that makes no new block: see `CLOCK_SKEW_SECONDS`.
    """
    if not isinstance(chain_ref, Mapping):
        raise InvalidChainRef("chain_ref must be an object")
    kind = chain_ref.get("kind")
    if kind in ("eip3009", "permit2"):
        ref = _evm_ref(chain_ref)
        hashes = [h for h in (tx_hash, chain_ref.get("tx_hash")) if h is not None]
        candidates = list(dict.fromkeys(_tx_hash(h) for h in hashes))
        return await _probe_evm(ref, rpc, candidates, max(0, log_lookback_blocks),
                                time.time() if now is None else now)
    if kind == "svm":
        svm = _SvmRef.parse(chain_ref)
        signature = svm.signature
        if tx_hash is not None:
            given = _signature(tx_hash, "tx_hash")
            if signature is not None and given != signature:
                raise InvalidChainRef("the row's tx_hash is not chain_ref's signature")
            signature = given
        return await _probe_svm(svm, rpc, signature, max(1, max_history_pages))
    raise InvalidChainRef(f"unknown chain_ref kind {kind!r}")


# ---------------------------------------------------------------------- EVM


class _EvmRef(Protocol):
    """What the EVM probes need of a signed transfer, whichever contract keeps its nonce."""

    what: str  # "authorization" or "permit", for reasons

    @property
    def expiry(self) -> str: ...  # "validBefore 123" / "deadline 123"

    @property
    def ends(self) -> int: ...  # the first block timestamp at which it can no longer move

    @property
    def named_time(self) -> int: ...  # the timestamp `expiry` names

    @property
    def open_note(self) -> str: ...  # "authorization unused and valid until 123"

    @property
    def settler(self) -> str | None: ...  # the only account that may submit it, if one

    async def used(self, rpc: JsonRpc, block: int) -> bool: ...

    async def find_use(self, rpc: JsonRpc, tx_hashes: list[str], block: int,
                       lookback: int) -> Verdict: ...


def _evm_ref(chain_ref: Mapping[str, Any]) -> _EvmRef:
    kind = chain_ref.get("kind")
    if kind == "eip3009":
        return _Eip3009Ref.parse(chain_ref)
    if kind == "permit2":
        return _Permit2Ref.parse(chain_ref)
    raise InvalidChainRef(f"not an EVM chain_ref (kind {kind!r})")


@dataclass(frozen=True)
class _Eip3009Ref:
    token: str  # lowercase 0x addresses and nonce
    authorizer: str
    valid_before: int
    nonce: str
    what = "authorization"
    settler = None  # anyone holding the signed authorization may submit it

    @classmethod
    def parse(cls, ref: Mapping[str, Any]) -> _Eip3009Ref:
        for name in ("to", "value", "valid_after"):  # not needed to probe, but part of a sound ref
            if name not in ref:
                raise InvalidChainRef(f"chain_ref has no {name}")
        _uint(ref["value"], "value")
        _uint(ref["valid_after"], "valid_after")
        _address(ref["to"], "to")
        return cls(
            token=_address(ref.get("token"), "token"),
            authorizer=_address(ref.get("from"), "from"),
            valid_before=_uint(ref.get("valid_before"), "valid_before"),
            nonce=_bytes32(ref.get("nonce"), "nonce"),
        )

    @property
    def authorizer_topic(self) -> str:
        return _topic(self.authorizer)

    @property
    def expiry(self) -> str:
        return f"validBefore {self.valid_before}"

    @property
    def ends(self) -> int:
        return self.valid_before  # transferWithAuthorization needs block.timestamp < validBefore

    @property
    def named_time(self) -> int:
        return self.valid_before

    @property
    def open_note(self) -> str:
        return f"authorization unused and valid until {self.valid_before}"

    async def used(self, rpc: JsonRpc, block: int) -> bool:
        data = "0x" + AUTHORIZATION_STATE_SELECTOR + self.authorizer_topic[2:] + self.nonce[2:]
        answer = await rpc.call("eth_call", [{"to": self.token, "data": data}, hex(block)])
        # Exactly one ABI word, 0 or 1: "0x" (no code at the token) or anything else is not an
        # answer.
        if not isinstance(answer, str) or not _BYTES32.fullmatch(answer) or int(answer, 16) > 1:
            raise UnexpectedAnswer("eth_call authorizationState: not a bool")
        return int(answer, 16) == 1

    async def find_use(self, rpc: JsonRpc, tx_hashes: list[str], block: int,
                       lookback: int) -> Verdict:
        for tx_hash in tx_hashes:
            if await _succeeded_with(rpc, tx_hash,
                                     lambda log: self._event(log) == AUTHORIZATION_USED_TOPIC):
                return Moved(tx_hash)
        logs = await _logs(rpc, {
            "address": self.token, **_window(block, lookback),
            "topics": [[AUTHORIZATION_USED_TOPIC, AUTHORIZATION_CANCELED_TOPIC],
                       self.authorizer_topic, self.nonce],
        })
        events = [(self._event(log), log) for log in logs]
        for topic, log in events:
            if topic == AUTHORIZATION_USED_TOPIC:
                return Moved(_tx_hash(log.get("transactionHash"), UnexpectedAnswer))
        if any(topic == AUTHORIZATION_CANCELED_TOPIC for topic, _ in events):
            return CannotMove("authorization canceled by its signer before it was used")
        return Moved(None)  # used, by a transaction older than the searched blocks

    def _event(self, log: Any) -> str | None:
        """The topic of the token's AuthorizationUsed/Canceled log for this authorization."""
        topics = _topics_of(log, self.token)
        if topics is None or len(topics) != 3 or topics[1:] != [self.authorizer_topic, self.nonce]:
            return None
        return topics[0] if topics[0] in (AUTHORIZATION_USED_TOPIC,
                                          AUTHORIZATION_CANCELED_TOPIC) else None


@dataclass(frozen=True)
class _Permit2Ref:
    """A Permit2 witness transfer: an `upto` payment through the upto proxy (`spender`), which
    only `facilitator` may submit (the proxy checks msg.sender against the signed witness); or a
    channel deposit (its ref carries a `channel_id`) through the Permit2 deposit collector,
    which anyone may submit through the batch-settlement contract."""

    token: str  # lowercase 0x addresses
    owner: str
    spender: str
    to: str
    facilitator: str | None  # None: a deposit
    nonce: int
    deadline: int
    what = "permit"

    @classmethod
    def parse(cls, ref: Mapping[str, Any]) -> _Permit2Ref:
        deposit = "channel_id" in ref
        # not needed to probe, but part of a sound ref: the amount, and the witness
        _uint(ref.get("max"), "max")
        if deposit:
            _bytes32(ref.get("channel_id"), "channel_id")
        else:
            _uint(ref.get("valid_after"), "valid_after")
        nonce = _uint(ref.get("nonce"), "nonce")
        if nonce >= 2**256:
            raise InvalidChainRef("chain_ref's nonce is not a uint256")
        return cls(
            token=_address(ref.get("token"), "token"),
            owner=_address(ref.get("owner"), "owner"),
            spender=_address(ref.get("spender"), "spender"),
            to=_address(ref.get("to"), "to"),
            facilitator=None if deposit else _address(ref.get("facilitator"), "facilitator"),
            nonce=nonce,
            deadline=_uint(ref.get("deadline"), "deadline"),
        )

    @property
    def settler(self) -> str | None:
        return self.facilitator

    @property
    def word(self) -> int:
        return self.nonce >> 8  # Permit2's bitmapPositions: the word, then the bit within it

    @property
    def bit(self) -> int:
        return 1 << (self.nonce & 0xFF)

    @property
    def expiry(self) -> str:
        return f"deadline {self.deadline}"

    @property
    def ends(self) -> int:
        return self.deadline + 1  # Permit2 reverts only when block.timestamp > deadline

    @property
    def named_time(self) -> int:
        return self.deadline

    @property
    def open_note(self) -> str:
        return f"permit unused and valid through its deadline {self.deadline}"

    async def used(self, rpc: JsonRpc, block: int) -> bool:
        """Whether the owner's nonce is spent in Permit2's bitmap (by a use or an invalidation)."""
        data = ("0x" + NONCE_BITMAP_SELECTOR + _topic(self.owner)[2:]
                + f"{self.word:064x}")
        answer = await rpc.call("eth_call", [{"to": PERMIT2, "data": data}, hex(block)])
        # One ABI word: "0x" (no Permit2 on this chain) or anything else is not an answer.
        if not isinstance(answer, str) or not _BYTES32.fullmatch(answer):
            raise UnexpectedAnswer("eth_call nonceBitmap: not a uint256 (is Permit2 deployed?)")
        return int(answer, 16) & self.bit != 0

    async def find_use(self, rpc: JsonRpc, tx_hashes: list[str], block: int,
                       lookback: int) -> Verdict:
        """The nonce is spent: by our settlement (the transaction), or by its owner's
        `invalidateUnorderedNonces` before any settlement used it (nothing moved, nothing can)."""
        for tx_hash in tx_hashes:  # (a proxy call settling another permit is not this one's)
            if (await _succeeded_with(rpc, tx_hash, self._pays)
                    and await self._settles(rpc, tx_hash) is not False):
                return Moved(tx_hash)
        window = _window(block, lookback)
        found, unknown = await self._search_settlement(rpc, window)
        if found is not None:
            return Moved(found)
        return await self._invalidated_unused(rpc, window, unknown)

    async def _search_settlement(self, rpc: JsonRpc, window: dict[str, str]
                                 ) -> tuple[str | None, list[Any]]:
        """This permit's settlement among the window's transfers from `owner` to `to` (newest
        first: the likely one is recent), and the transfers that may be it (None: cannot tell)."""
        transfers = await _logs(rpc, {"address": self.token, **window, "topics": [
            TRANSFER_TOPIC, _topic(self.owner), _topic(self.to)]})
        unknown = []
        for log in reversed([log for log in transfers if self._pays(log)]):
            tx_hash = _tx_hash(log.get("transactionHash"), UnexpectedAnswer)
            ours = await self._settles(rpc, tx_hash)
            if ours:
                return tx_hash, []
            if ours is None:
                unknown.append(log)
        return None, unknown

    async def _invalidated_unused(self, rpc: JsonRpc, window: dict[str, str],
                                  unknown: list[Any]) -> Verdict:
        """CannotMove when the owner's invalidation spent the bit, else Moved(None): a use the
        search did not find (older, or not a direct call of the proxy)."""
        invalidations = [log for log in await _logs(rpc, {"address": PERMIT2, **window, "topics": [
            UNORDERED_NONCE_INVALIDATION_TOPIC, _topic(self.owner)]}) if self._invalidates(log)]
        if not invalidations:
            return Moved(None)
        first = min(_position(log) for log in invalidations)
        if first[0] == 0 or await self.used(rpc, first[0] - 1):
            return Moved(None)  # spent before the first invalidation the search found
        # Unset until that block: a use could only come before the invalidation within it (later,
        # Permit2 refuses the spent nonce), and every use pays `to` from `owner`.
        if any(_position(log)[0] == first[0] and _position(log) < first for log in unknown):
            return Moved(None)  # a transfer to the payee just before it may have been the use
        return CannotMove(f"permit nonce invalidated by its owner (Permit2 "
                          f"UnorderedNonceInvalidation, block {first[0]}) before it was used")

    def _pays(self, log: Any) -> bool:
        """The token's Transfer(owner -> to): what every use of this permit logs (the proxy
        refuses a zero amount)."""
        topics = _topics_of(log, self.token)
        return topics == [TRANSFER_TOPIC, _topic(self.owner), _topic(self.to)]

    def _invalidates(self, log: Any) -> bool:
        topics = _topics_of(log, PERMIT2)
        if topics != [UNORDERED_NONCE_INVALIDATION_TOPIC, _topic(self.owner)]:
            return False
        data = log.get("data")
        if not isinstance(data, str) or not re.fullmatch(r"0x[0-9a-fA-F]{128}", data):
            raise UnexpectedAnswer("eth_getLogs: an UnorderedNonceInvalidation without (word, mask)")
        return int(data[2:66], 16) == self.word and int(data[66:], 16) & self.bit != 0

    async def _settles(self, rpc: JsonRpc, tx_hash: str) -> bool | None:
        """Whether a mined transaction is the proxy's settlement of this permit (True), of
        another (False), or not a direct call of the proxy (None: cannot tell); for a deposit,
        the batch-settlement contract's deposit through this collector."""
        tx = await rpc.call("eth_getTransactionByHash", [tx_hash])
        if not isinstance(tx, dict) or not isinstance(tx.get("input"), str):
            raise UnexpectedAnswer("eth_getTransactionByHash: not the mined transaction")
        data = tx["input"]
        if self.facilitator is None:
            return self._deposits(str(tx.get("to") or "").lower(), data)
        skip = _SETTLE_PERMIT_WORD.get(data[2:10].lower())
        if str(tx.get("to") or "").lower() != self.spender or skip is None:
            return None
        words = [data[10 + 64 * i: 74 + 64 * i] for i in range(skip, skip + 6)]
        if not all(_HEX64.fullmatch(word) for word in words):
            return None
        # permit ((token, amount), nonce, deadline), amount, owner
        return int(words[2], 16) == self.nonce and int(words[5], 16) == int(self.owner, 16)

    def _deposits(self, to: str, data: str) -> bool | None:
        """Whether `data`, sent to `to`, is a deposit of this permit (True), another deposit
        (False), or no direct deposit call (None: cannot tell)."""
        if to != BATCH_SETTLEMENT or data[2:10].lower() != _DEPOSIT_SELECTOR:
            return None
        word = _abi_word_reader(data[10:])
        offset = word(_DEPOSIT_DATA_WORD)
        if offset is None or offset % 32:
            return None
        payer, collector = word(0), word(_DEPOSIT_COLLECTOR_WORD)
        nonce = word(offset // 32 + 1)  # collectorData: its length, then (nonce, deadline, ...)
        if payer is None or collector is None or nonce is None:
            return None
        return (collector == int(self.spender, 16) and payer == int(self.owner, 16)
                and nonce == self.nonce)


def _abi_word_reader(args: str) -> Callable[[int], int | None]:
    """The i-th 32-byte word of hex ABI arguments, or None past their end or not hex."""
    def word(i: int) -> int | None:
        text = args[64 * i: 64 * i + 64]
        return int(text, 16) if _HEX64.fullmatch(text) else None
    return word


async def _succeeded_with(rpc: JsonRpc, tx_hash: str, holds: Callable[[Any], bool]) -> bool:
    """Whether the transaction is mined, succeeded, and logged something that `holds`."""
    receipt = await rpc.call("eth_getTransactionReceipt", [tx_hash])
    if receipt is None:
        return False
    if not isinstance(receipt, dict) or not isinstance(receipt.get("logs"), list):
        raise UnexpectedAnswer("eth_getTransactionReceipt: not a receipt")
    succeeded = _quantity(receipt.get("status"), "receipt status") == 1
    return succeeded and any(holds(log) for log in receipt["logs"])


async def _logs(rpc: JsonRpc, query: dict[str, Any]) -> list[Any]:
    logs = await rpc.call("eth_getLogs", [query])
    if not isinstance(logs, list):
        raise UnexpectedAnswer("eth_getLogs: not a list of logs")
    return logs


def _window(block: int, lookback: int) -> dict[str, str]:
    return {"fromBlock": hex(max(0, block - lookback)), "toBlock": hex(block)}


def _topics_of(log: Any, address: str) -> list[str] | None:
    """A log's topics (lower case) when `address` emitted it and it was not removed."""
    if not isinstance(log, dict) or log.get("removed") is True:
        return None
    topics = log.get("topics")
    if str(log.get("address", "")).lower() != address or not isinstance(topics, list):
        return None
    return [str(t).lower() for t in topics]


def _position(log: Mapping[str, Any]) -> tuple[int, int]:
    return (_quantity(log.get("blockNumber"), "log blockNumber"),
            _quantity(log.get("logIndex"), "log logIndex"))


def _topic(address: str) -> str:
    return "0x" + "00" * 12 + address[2:]


# A quiet chain makes no block, so its head's timestamp never reaches an authorization's
# validBefore (a permit's deadline). The next block that could include it will be stamped with
# the time it is made: once this machine's clock is past that time by more than any plausible
# difference between the clocks (Base's sequencer and validators keep to real time within
# seconds), no block can take it. An unused authorization is then as good as expired.
CLOCK_SKEW_SECONDS = 120


async def _probe_evm(ref: _EvmRef, rpc: JsonRpc, tx_hashes: list[str], lookback: int,
                     now: float) -> Verdict:
    # After the timestamp, and at its block: see the module's docstring.
    block, timestamp, final = await _used_or_expired(rpc, ref, tx_hashes, lookback)
    if final is not None:
        return final
    if now >= ref.ends + CLOCK_SKEW_SECONDS:
        return CannotMove(f"{ref.what} expired unused ({ref.expiry}; the clock is "
                          f"{now - ref.named_time:.0f} s past it, block {block} at {timestamp})")
    notes = [await _receipt_note(rpc, h, block) for h in tx_hashes]
    return StillOpen("; ".join([f"{ref.open_note} (block {block} at {timestamp})", *notes]))


async def probe_our_sends(chain_ref: Mapping[str, Any], rpc: JsonRpc, sender: str, *,
                          tx_hashes: Sequence[str] = (),
                          log_lookback_blocks: int = DEFAULT_LOG_LOOKBACK_BLOCKS) -> Verdict:
    """Can any transaction of ours still move this EIP-3009 authorization or Permit2 permit? (see
    the module's docstring). `sender`: the in-process facilitator's address; `tx_hashes`: the
    transactions the settlement named (its ledger row's). The caller holds the key's send lock,
    and no settlement of this payment can begin a send any more. Answers `Moved` (it was used
    after all), `CannotMove` (proven), `Draining` (provable once the key's nonce reaches `nonce`:
    ask `probe_nonce_reached` later, without the lock) or `StillOpen` (not provable before it
    expires)."""
    ref, block, verdict = await _unused_authorization(chain_ref, rpc, tx_hashes,
                                                      log_lookback_blocks)
    if verdict is not None:
        return verdict
    key = _address(sender, "sender")
    if ref.settler not in (None, key):
        return StillOpen(f"the permit names facilitator {ref.settler}, not this key {key}: only "
                         f"that account can settle it, so nothing is provable before its "
                         f"{ref.expiry}")
    mined = await _nonce(rpc, key, hex(block))
    need = max(mined, await _nonce(rpc, key, "pending"))
    for tx_hash in tx_hashes:
        tx = await rpc.call("eth_getTransactionByHash", [_tx_hash(tx_hash)])
        if tx is None:
            return StillOpen(f"transaction {tx_hash} of this settlement is unknown to the node "
                             "(dropped, or never taken): whoever holds it could still send it while "
                             f"its nonce is free, so nothing is provable before its {ref.expiry}")
        if not isinstance(tx, dict):
            raise UnexpectedAnswer("eth_getTransactionByHash: not a transaction")
        mined_in = tx.get("blockNumber")
        if mined_in is not None and _quantity(mined_in, "transaction blockNumber") <= block:
            continue  # on chain at B, and the authorization is unused there: it did not use it
        if str(tx.get("from", "")).lower() != key:
            return StillOpen(f"transaction {tx_hash} of this settlement, sent from "
                             f"{tx.get('from')} (not {key}), is not mined at block {block}")
        need = max(need, _quantity(tx.get("nonce"), "transaction nonce") + 1)
    if mined >= need:
        return CannotMove(f"{ref.what} unused at block {block}, and nothing from the "
                          f"facilitator's key {key} waits in the node's pool (nonce {mined}): no "
                          "transaction of ours carries it, and no settlement can still send one")
    return Draining(f"{ref.what} unused at block {block}; {need - mined} transaction(s) of "
                    f"the facilitator's key {key} wait in the node's pool (nonce {mined} mined): "
                    f"provable once its nonce reaches {need}", nonce=need)


async def probe_nonce_reached(chain_ref: Mapping[str, Any], rpc: JsonRpc, sender: str,
                              nonce: int, *,
                              log_lookback_blocks: int = DEFAULT_LOG_LOOKBACK_BLOCKS) -> Verdict:
    """After `probe_our_sends` answered `Draining(nonce)`, and if no settlement of the payment
    began since (the caller checks its ledger row): `CannotMove` once the key's mined nonce
    reached `nonce` with the authorization (permit) still unused; `Moved` if it was used; else
    `Draining` again."""
    ref, block, verdict = await _unused_authorization(chain_ref, rpc, (), log_lookback_blocks)
    if verdict is not None:
        return verdict
    key = _address(sender, "sender")
    mined = await _nonce(rpc, key, hex(block))
    if mined >= nonce:
        return CannotMove(f"{ref.what} unused at block {block}, and the facilitator's key "
                          f"{key} reached nonce {mined} >= {nonce}: every transaction of that key "
                          "the node held when the reconciler looked is mined, none used it, and no "
                          "settlement can still send one")
    return Draining(f"{ref.what} unused at block {block}; the facilitator's key {key} is at "
                    f"nonce {mined} of {nonce}", nonce=nonce)


async def _unused_authorization(chain_ref: Mapping[str, Any], rpc: JsonRpc,
                                tx_hashes: Sequence[str], lookback: int
                                ) -> tuple[_EvmRef, int, Verdict | None]:
    """The head block, and a final verdict if the authorization was used or expired there."""
    if not isinstance(chain_ref, Mapping):
        raise InvalidChainRef("chain_ref must be an object")
    ref = _evm_ref(chain_ref)
    candidates = list(dict.fromkeys(_tx_hash(h) for h in tx_hashes))
    block, _, final = await _used_or_expired(rpc, ref, candidates, max(0, lookback))
    return ref, block, final


async def _used_or_expired(rpc: JsonRpc, ref: _EvmRef, tx_hashes: Sequence[str],
                           lookback: int) -> tuple[int, int, Verdict | None]:
    """The head block and its timestamp, and a final verdict if the authorization was used (the
    transaction that used it) or expired unused there."""
    head = await rpc.call("eth_getBlockByNumber", ["latest", False])
    if not isinstance(head, dict):
        raise UnexpectedAnswer("eth_getBlockByNumber: no latest block")
    block = _quantity(head.get("number"), "eth_getBlockByNumber number")
    timestamp = _quantity(head.get("timestamp"), "eth_getBlockByNumber timestamp")
    if await ref.used(rpc, block):
        return block, timestamp, await ref.find_use(rpc, list(tx_hashes), block, lookback)
    if timestamp >= ref.ends:
        return block, timestamp, CannotMove(f"{ref.what} expired unused ({ref.expiry}, block "
                                            f"{block} at {timestamp})")
    return block, timestamp, None


async def _nonce(rpc: JsonRpc, address: str, block: str) -> int:
    return _quantity(await rpc.call("eth_getTransactionCount", [address, block]),
                     "eth_getTransactionCount")


async def _receipt_note(rpc: JsonRpc, tx_hash: str, block: int) -> str:
    """What the known transaction did, for a StillOpen reason."""
    receipt = await rpc.call("eth_getTransactionReceipt", [tx_hash])
    if receipt is None:
        return f"transaction {tx_hash} not mined"
    if not isinstance(receipt, dict):
        raise UnexpectedAnswer("eth_getTransactionReceipt: not a receipt")
    if _quantity(receipt.get("status"), "receipt status") == 0:
        return (f"transaction {tx_hash} reverted, but the authorization is unused and not expired: "
                "it may still be submitted")
    if _quantity(receipt.get("blockNumber"), "receipt blockNumber") > block:
        return f"transaction {tx_hash} mined after block {block}"
    return f"transaction {tx_hash} succeeded without using this authorization"


# ---------------------------------------------------------------------- Solana


@dataclass(frozen=True)
class _SvmRef:
    message_hash: str
    signature: str | None
    blockhash: str
    search_address: str  # whose history holds the transaction: the debited account, ideally

    @classmethod
    def parse(cls, ref: Mapping[str, Any]) -> _SvmRef:
        message_hash = ref.get("message_hash")
        if not isinstance(message_hash, str) or not _HEX64.fullmatch(message_hash):
            raise InvalidChainRef("chain_ref's message_hash is not 64 hex digits")
        signature = ref.get("signature")
        fee_payer = _pubkey(ref.get("fee_payer"), "fee_payer")
        accounts = [_pubkey(ref[name], name) for name in ("source_ata", "destination_ata")
                    if ref.get(name) is not None]
        return cls(
            message_hash=message_hash.lower(),
            signature=None if signature is None else _signature(signature, "signature"),
            blockhash=_blockhash(ref.get("blockhash")),
            # The fee payer's history is the busiest (every settlement): the last resort.
            search_address=(accounts or [fee_payer])[0],
        )


def svm_message_hash(transaction: bytes) -> str:
    """The ledger's identity of a Solana payment: sha256 (hex) of `bytes(tx.message)`.

    The same digest as `payments.processor.identify` (solders' message serialization, which for a
    v0 message leaves out the 0x80 version prefix).
    """
    from solders.transaction import VersionedTransaction

    return hashlib.sha256(bytes(VersionedTransaction.from_bytes(transaction).message)).hexdigest()


async def _probe_svm(ref: _SvmRef, rpc: JsonRpc, signature: str | None, max_pages: int) -> Verdict:
    expired = not await _blockhash_valid(rpc, ref.blockhash)
    if signature is not None:
        status = await _signature_status(rpc, signature)
        if status is not None:
            return _status_verdict(status, signature)
        if expired:
            return CannotMove("blockhash expired, transaction never landed")
        return StillOpen("transaction not found; its blockhash is still valid, it may still land")
    if not expired:
        return StillOpen("transaction id unknown; its blockhash is still valid, it may still land")
    return await _search_history(ref, rpc, max_pages)


async def _blockhash_valid(rpc: JsonRpc, blockhash: str) -> bool:
    answer = await rpc.call("isBlockhashValid", [blockhash, {"commitment": _COMMITMENT}])
    value = answer.get("value") if isinstance(answer, dict) else None
    if not isinstance(value, bool):
        raise UnexpectedAnswer("isBlockhashValid: no boolean value")
    return value


async def _signature_status(rpc: JsonRpc, signature: str) -> dict[str, Any] | None:
    answer = await rpc.call("getSignatureStatuses", [[signature], {"searchTransactionHistory": True}])
    value = answer.get("value") if isinstance(answer, dict) else None
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], dict | None):
        raise UnexpectedAnswer("getSignatureStatuses: not one status")
    if value[0] is not None and "err" not in value[0]:
        raise UnexpectedAnswer("getSignatureStatuses: a status without err")
    return value[0]


def _status_verdict(status: Mapping[str, Any], signature: str) -> Verdict:
    level = status.get("confirmationStatus")
    if level is None and status.get("confirmations", 0) is None:
        level = "finalized"  # nodes before confirmationStatus: null confirmations means rooted
    if level not in ("confirmed", "finalized"):
        return StillOpen(f"transaction seen at {level or 'unknown'} commitment only; "
                         "it may still be dropped")
    return _landed_verdict(status.get("err"), signature)


def _landed_verdict(err: Any, signature: str) -> Verdict:
    if err is None:
        return Moved(signature)
    return CannotMove(f"transaction landed and failed: {json.dumps(err, sort_keys=True)}")


async def _search_history(ref: _SvmRef, rpc: JsonRpc, max_pages: int) -> Verdict:
    """The blockhash has expired: did a transaction with this message land before it did?"""
    before: str | None = None
    searched = 0
    for _ in range(max_pages):
        config: dict[str, Any] = {"limit": SIGNATURES_PAGE, "commitment": _COMMITMENT}
        if before is not None:
            config["before"] = before
        page = await rpc.call("getSignaturesForAddress", [ref.search_address, config])
        if not isinstance(page, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("signature"), str) for entry in page
        ):
            raise UnexpectedAnswer("getSignaturesForAddress: not a list of signatures")
        signatures = [entry["signature"] for entry in page]
        for start in range(0, len(signatures), _FETCH_CONCURRENCY):
            chunk = signatures[start : start + _FETCH_CONCURRENCY]
            # Every call runs to its end (none left behind); the first failure is raised.
            found = await asyncio.gather(*(_transaction(rpc, s) for s in chunk), return_exceptions=True)
            for item in found:
                if isinstance(item, BaseException):
                    raise item
            for signature, (message_hash, err) in zip(chunk, cast(list[tuple[str, Any]], found),
                                                      strict=True):
                if message_hash == ref.message_hash:
                    return _landed_verdict(err, signature)
        searched += len(signatures)
        if len(signatures) < SIGNATURES_PAGE:
            return CannotMove("blockhash expired and no transaction with this message landed")
        before = signatures[-1]
    return StillOpen(f"blockhash expired; the newest {searched} transactions of {ref.search_address} "
                     "hold none with this message, and its history goes further back")


async def _transaction(rpc: JsonRpc, signature: str) -> tuple[str, Any]:
    """A landed transaction's message hash and error."""
    answer = await rpc.call("getTransaction", [signature, {
        "encoding": "base64", "maxSupportedTransactionVersion": 0, "commitment": _COMMITMENT}])
    if not isinstance(answer, dict):
        # Listed in the history but not readable: the node is inconsistent or pruned; never guess.
        raise UnexpectedAnswer("getTransaction: a listed transaction is not available")
    encoded, meta = answer.get("transaction"), answer.get("meta")
    if (not isinstance(encoded, list) or len(encoded) != 2 or encoded[1] != "base64"
            or not isinstance(encoded[0], str) or not isinstance(meta, dict) or "err" not in meta):
        raise UnexpectedAnswer("getTransaction: not a base64 transaction with its meta")
    try:
        message_hash = svm_message_hash(base64.b64decode(encoded[0], validate=True))
    except (binascii.Error, ValueError) as exc:
        raise UnexpectedAnswer("getTransaction: the transaction does not decode") from exc
    return message_hash, meta["err"]


# ---------------------------------------------------------------------- parsing


def _address(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value):
        raise InvalidChainRef(f"chain_ref's {name} is not an address")
    return value.lower()


def _bytes32(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _BYTES32.fullmatch(value):
        raise InvalidChainRef(f"chain_ref's {name} is not 32 bytes of 0x hex")
    return value.lower()


def _uint(value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise InvalidChainRef(f"chain_ref's {name} is not an unsigned integer")


def _tx_hash(value: Any, error: type[Exception] = InvalidChainRef) -> str:
    if not isinstance(value, str) or not _BYTES32.fullmatch(value):
        raise error("a transaction hash is not 32 bytes of 0x hex")
    return value.lower()


def _quantity(value: Any, what: str) -> int:
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise UnexpectedAnswer(f"{what}: not a hex quantity")
    return int(value, 16)


def _pubkey(value: Any, name: str) -> str:
    from solders.pubkey import Pubkey

    try:
        return str(Pubkey.from_string(value))
    except Exception:  # solders raises its own (and panic) types for bad input
        raise InvalidChainRef(f"chain_ref's {name} is not a Solana address") from None


def _blockhash(value: Any) -> str:
    from solders.hash import Hash

    try:
        return str(Hash.from_string(value))
    except Exception:
        raise InvalidChainRef("chain_ref's blockhash is not a Solana blockhash") from None


def _signature(value: Any, name: str) -> str:
    from solders.signature import Signature

    try:
        return str(Signature.from_string(value))
    except Exception:
        raise InvalidChainRef(f"{name} is not a Solana transaction signature") from None
