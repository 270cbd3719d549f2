"""The in-process Solana devnet: LiteSVM with the real SPL programs and the devnet USDC mint.

It mirrors Solana devnet closely enough that the x402 SDK's own client and facilitator code run
against it unchanged: the same network id, the same USDC mint address (6 decimals), the real SPL
Token, Associated Token Account and Memo programs (LiteSVM ships them as default programs), real
signature checks and fees. `rpc()` answers the subset of Solana's JSON-RPC API that solana-py (and
so the SDK's `ExactSvmScheme` client and `FacilitatorKeypairSigner`) uses, with the documented
response shapes; `facilitator_signer()` is the same facilitator without the HTTP hop.

Time and blockhashes. Slots advance with the clock, one per 400 ms as on Solana, and each slot
has its own blockhash. Solana accepts a blockhash for 150 blocks (about 60-90 s); here a
blockhash lives `blockhash_lifetime_slots` (default 2,250 slots = 15 minutes) so that a quote
carrying `recentBlockhash` never goes stale during a test run or a slow manual payment, while a
signed but unsent payment still expires as on devnet. LiteSVM itself only accepts its single
latest blockhash, so its check is off and this module keeps the window.

Replays. LiteSVM remembers only its last 32 signatures: with an unchanged blockhash, a
transaction replayed after 32 others is executed again. This module keeps every landed signature
for as long as its blockhash is valid, so a replay is refused with `AlreadyProcessed` while it
could still land and with `BlockhashNotFound` afterwards, the guarantee Solana's status cache
gives.

History. Every landed transaction is also kept for good (chain state is in memory anyway), as an
RPC node with full history keeps it: `getSignatureStatuses` with `searchTransactionHistory`,
`getTransaction` (base64/base58 encodings) and `getSignaturesForAddress` (newest first, by the
transaction's account keys) answer from it after the status cache has forgotten the signature.
LiteSVM's own airdrops have a status there but no transaction (`getTransaction` answers null)
and are not listed by address.

Fees. LiteSVM charges the signature fees only; the compute-unit price (priority fee) is charged
here, rounded up as Solana does, so the facilitator pays what it would on devnet.

Processing control, for fault-injection tests: `devnet_setAutoProcess [false]` makes
`sendTransaction` check the transaction (sanitize, signatures; the preflight simulation unless
skipped), queue it and return its signature, as a node does before the leader runs it;
`getSignatureStatuses` answers null for it until `devnet_processQueued` runs the queue in order
(what cannot land then is dropped, as a node drops it) and answers what each one did.
`devnet_setAutoProcess [true]` processes the queue and goes back to running each at once. The
devnet's own transactions (faucet mints, airdrops) and the in-process signer never queue.

Threads. The chain is used from worker threads and the server thread at once: every access to
LiteSVM and to the bookkeeping goes through one re-entrant lock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from solders.account import Account
from solders.epoch_schedule import EpochSchedule
from solders.hash import Hash, ParseHashError
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.rpc.responses import (
    RpcResponseContext,
    RpcSimulateTransactionResult,
    SimulateTransactionResp,
)
from solders.signature import Signature
from solders.token.associated import get_associated_token_address
from solders.token.state import Mint, TokenAccount
from solders.transaction import VersionedTransaction
from solders.transaction_metadata import SimulatedTransactionInfo, TransactionMetadata
from x402.extensions.sign_in_with_x.solana import decode_base58, encode_base58
from x402.mechanisms.svm.signer import FacilitatorSvmSigner

from ..broadcast_trace import trace
from . import jsonrpc
from .jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND

TOKEN_PROGRAM = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
ATA_PROGRAM = Pubkey.from_string("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")
MEMO_PROGRAM = Pubkey.from_string("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr")
SYSTEM_PROGRAM = Pubkey.from_string("11111111111111111111111111111111")
COMPUTE_BUDGET_PROGRAM = Pubkey.from_string("ComputeBudget111111111111111111111111111111")
MINT_LEN = 82  # packed SPL Token account sizes
TOKEN_ACCOUNT_LEN = 165

LAMPORTS_PER_SOL = 1_000_000_000
SLOT_SECONDS = 0.4
BLOCKHASH_LIFETIME_SLOTS = 2_250  # 15 minutes of 400 ms slots; Solana's own window is 150
MAX_RPC_AIRDROP_LAMPORTS = 100 * LAMPORTS_PER_SOL
MAX_SIGNATURE_STATUSES = 256  # Solana's limit per getSignatureStatuses call
MAX_SIGNATURES_FOR_ADDRESS = 1_000  # Solana's limit (and default) per getSignaturesForAddress call
LAMPORTS_PER_SIGNATURE = 5_000  # LiteSVM's base fee, as Solana's
MAX_QUEUED_TRANSACTIONS = 1_024  # sendTransaction's queue while auto-processing is off
U64_MAX = 2**64 - 1
SOLANA_CORE_VERSION = "2.2.0"  # the Agave line LiteSVM in solders 0.27 is built from
FEATURE_SET = 3294202862

# Solana's own JSON-RPC error codes (the standard ones are in jsonrpc).
SEND_FAILURE = -32002  # "Transaction simulation failed: ..." with the simulation as data
SIGNATURE_FAILURE = -32003  # "Transaction signature verification failure"
UNSUPPORTED_TRANSACTION_VERSION = -32015

_ERROR_TEXT = {
    "AlreadyProcessed": "This transaction has already been processed",
    "BlockhashNotFound": "Blockhash not found",
    "SignatureFailure": "Transaction did not pass signature verification",
    "AccountNotFound": "Attempt to debit an account but found no record of a prior credit.",
    "InsufficientFundsForFee": "Insufficient funds for fee",
    "SanitizeFailure": "Transaction failed to sanitize accounts offsets correctly",
}


class RpcError(Exception):
    """A JSON-RPC error answer (code, message, optional data)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass(frozen=True)
class _Status:
    slot: int
    err: Any  # Solana's JSON form of the TransactionError, None on success
    blockhash_slot: int  # the slot its blockhash belongs to; the status lives as long


@dataclass(frozen=True)
class _Landed:
    """A landed transaction as a node with full history reports it (getTransaction)."""

    slot: int
    err: Any
    tx: VersionedTransaction | None = None  # None for LiteSVM's own airdrops
    fee: int = 0
    pre_balances: tuple[int, ...] = ()
    post_balances: tuple[int, ...] = ()
    logs: tuple[str, ...] = ()
    units_consumed: int = 0


@dataclass(frozen=True)
class _Outcome:
    """What running (or simulating) one transaction did."""

    signature: str
    err: Any
    logs: list[str]
    units_consumed: int
    landed: bool  # recorded on chain (fee charged), whether or not it failed
    return_data: Any = None
    post_accounts: dict[Pubkey, Account] | None = None


class SolanaDevnet:
    """An in-process Solana chain that mirrors devnet, with the devnet USDC mint."""

    NETWORK = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
    V1_NETWORK = "solana-devnet"
    USDC_MINT = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"
    USDC_DECIMALS = 6
    GENESIS_HASH = "EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG"  # devnet's; CAIP-2 is its prefix
    FEE_PAYER_LAMPORTS = 1_000 * LAMPORTS_PER_SOL
    MINT_AUTHORITY_LAMPORTS = 1_000 * LAMPORTS_PER_SOL

    def __init__(
        self,
        *,
        fee_payer: Keypair,
        mint_authority: Keypair,
        blockhash_lifetime_slots: int = BLOCKHASH_LIFETIME_SLOTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Start the chain, create the USDC mint and fund the fee payer and mint authority.

        `clock` (seconds, monotonic) drives slots and blockhash expiry; tests may pass a fake.
        """
        if blockhash_lifetime_slots < 1:
            raise ValueError("blockhash_lifetime_slots must be at least 1")
        self._lock = threading.RLock()
        self._fee_payer = fee_payer
        self._mint_authority = mint_authority
        self._mint = Pubkey.from_string(self.USDC_MINT)
        self._lifetime = blockhash_lifetime_slots
        self._clock = clock
        self._t0 = clock()
        self._unix0 = int(time.time())
        self._slot = 0
        self._seed = os.urandom(32)  # each devnet has its own blockhashes
        self._blockhashes: dict[Hash, int] = {}  # issued blockhash -> its slot (oldest first)
        self._statuses: dict[str, _Status] = {}  # signature -> status (oldest blockhash first)
        self._history: dict[str, _Landed] = {}  # signature -> every landed transaction, kept
        self._by_address: dict[str, list[str]] = {}  # account key -> its signatures, oldest first
        self._tx_count = 0
        self._memo_counter = 0
        self._auto_process = True
        self._queue: dict[str, VersionedTransaction] = {}  # signature -> tx, in arrival order
        self._signer: DevnetFacilitatorSigner | None = None
        # Blockhash age is checked here (LiteSVM only knows one blockhash); signatures are
        # checked both here (for RPC error precedence) and by LiteSVM.
        self._svm = LiteSVM().with_blockhash_check(False)
        self._svm.set_epoch_schedule(EpochSchedule.without_warmup())  # as devnet runs today
        self._create_mint()
        self.airdrop(str(fee_payer.pubkey()), self.FEE_PAYER_LAMPORTS)
        self.airdrop(str(mint_authority.pubkey()), self.MINT_AUTHORITY_LAMPORTS)

    # ------------------------------------------------------------------ public helpers

    def facilitator_signer(self) -> FacilitatorSvmSigner:
        """The SDK's FacilitatorSvmSigner over this chain, signing with the fee payer key."""
        with self._lock:
            if self._signer is None:
                self._signer = DevnetFacilitatorSigner(self, self._fee_payer)
            return self._signer

    def mint_to(self, owner: str, amount: int) -> str:
        """Mint test USDC (atomic units) to the owner, creating the token account if needed.

        `mint_to(owner, 0)` only creates it: x402 payees need one before anyone pays them.
        """
        if amount < 0:
            raise ValueError("amount must not be negative")
        with self._lock:
            owner_key = _pubkey(owner)
            mint_ix = Instruction(
                TOKEN_PROGRAM,
                bytes([14]) + amount.to_bytes(8, "little") + bytes([self.USDC_DECIMALS]),
                [
                    AccountMeta(self._mint, is_signer=False, is_writable=True),
                    AccountMeta(self._ata(owner_key), is_signer=False, is_writable=True),
                    AccountMeta(self._mint_authority.pubkey(), is_signer=True, is_writable=False),
                ],
            )  # MintToChecked
            return self._run_internal([self._create_ata_ix(owner_key), mint_ix], [self._mint_authority])

    def token_balance(self, owner: str) -> int:
        """The owner's USDC balance in atomic units; 0 without a token account."""
        with self._lock:
            account = self._svm.get_account(self._ata(_pubkey(owner)))
            if account is None or account.owner != TOKEN_PROGRAM:
                return 0
            return TokenAccount.from_bytes(bytes(account.data)).amount

    def airdrop(self, owner: str, lamports: int) -> None:
        """Give the address SOL, as devnet's faucet does."""
        self._airdrop(_pubkey(owner), lamports)

    def transfer(self, owner: Keypair, to_owner: str, amount: int) -> str:
        """A plain SPL TransferChecked of USDC between two owners' token accounts.

        The mint authority pays the fee and, if needed, the recipient's account rent, so the
        owner needs no SOL (as x402 payers hold none).
        """
        with self._lock:
            to_key = _pubkey(to_owner)
            transfer_ix = Instruction(
                TOKEN_PROGRAM,
                bytes([12]) + amount.to_bytes(8, "little") + bytes([self.USDC_DECIMALS]),
                [
                    AccountMeta(self._ata(owner.pubkey()), is_signer=False, is_writable=True),
                    AccountMeta(self._mint, is_signer=False, is_writable=False),
                    AccountMeta(self._ata(to_key), is_signer=False, is_writable=True),
                    AccountMeta(owner.pubkey(), is_signer=True, is_writable=False),
                ],
            )
            return self._run_internal(
                [self._create_ata_ix(to_key), transfer_ix], [self._mint_authority, owner]
            )

    # ------------------------------------------------------------------ JSON-RPC

    def rpc(self, method: str, params: list) -> jsonrpc.Answer:
        """Answer one Solana JSON-RPC call: `{"result": ...}` or `{"error": ...}`."""
        handler = _RPC_METHODS.get(method)
        if handler is None:
            return jsonrpc.error(METHOD_NOT_FOUND, "Method not found")
        try:
            with self._lock:
                self._tick()
                return jsonrpc.result(handler(self, params))
        except RpcError as exc:
            return jsonrpc.error(exc.code, exc.message, exc.data)
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, ParseHashError) as exc:
            return jsonrpc.error(INVALID_PARAMS, f"Invalid params: {exc}")
        except Exception as exc:  # a bug here must not take the HTTP endpoint down with it
            return jsonrpc.error(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")

    def _context(self) -> dict[str, Any]:
        return {"apiVersion": SOLANA_CORE_VERSION, "slot": self._slot}

    def _with_context(self, value: Any) -> dict[str, Any]:
        return {"context": self._context(), "value": value}

    def _rpc_get_account_info(self, params: list) -> Any:
        address = _pubkey(_param(params, 0, str))
        config = {"encoding": "binary"} | _config(params, 1)  # Solana's legacy default
        return self._with_context(self._encode_account(address, config))

    def _rpc_get_multiple_accounts(self, params: list) -> Any:
        addresses = [_pubkey(a) for a in _param(params, 0, list)]
        if len(addresses) > 100:
            raise RpcError(INVALID_PARAMS, "Too many inputs provided; max 100")
        config = {"encoding": "base64"} | _config(params, 1)
        return self._with_context([self._encode_account(a, config) for a in addresses])

    def _rpc_get_balance(self, params: list) -> Any:
        return self._with_context(self._svm.get_balance(_pubkey(_param(params, 0, str))) or 0)

    def _rpc_get_token_account_balance(self, params: list) -> Any:
        address = _pubkey(_param(params, 0, str))
        account = self._svm.get_account(address)
        if account is None:
            raise RpcError(INVALID_PARAMS, "Invalid param: could not find account")
        if account.owner != TOKEN_PROGRAM or len(account.data) != TOKEN_ACCOUNT_LEN:
            raise RpcError(INVALID_PARAMS, "Invalid param: not a Token account")
        token = TokenAccount.from_bytes(bytes(account.data))
        return self._with_context(_ui_amount(token.amount, self._decimals(token.mint)))

    def _rpc_get_token_supply(self, params: list) -> Any:
        address = _pubkey(_param(params, 0, str))
        account = self._svm.get_account(address)
        if account is None or account.owner != TOKEN_PROGRAM or len(account.data) != MINT_LEN:
            raise RpcError(INVALID_PARAMS, "Invalid param: not a Token mint")
        mint = Mint.from_bytes(bytes(account.data))
        return self._with_context(_ui_amount(mint.supply, mint.decimals))

    def _rpc_get_minimum_balance_for_rent_exemption(self, params: list) -> Any:
        size = _param(params, 0, int)
        if size < 0 or size > 10 * 1024 * 1024:
            raise RpcError(INVALID_PARAMS, "Invalid param: data length out of range")
        return self._svm.minimum_balance_for_rent_exemption(size)

    def _rpc_get_latest_blockhash(self, params: list) -> Any:
        blockhash, slot = self._issue_blockhash()
        return self._with_context(
            {"blockhash": str(blockhash), "lastValidBlockHeight": slot + self._lifetime}
        )

    def _rpc_is_blockhash_valid(self, params: list) -> Any:
        blockhash = Hash.from_string(_param(params, 0, str))
        return self._with_context(self._blockhash_valid(blockhash))

    def _rpc_get_slot(self, params: list) -> Any:
        return self._slot

    def _rpc_get_epoch_info(self, params: list) -> Any:
        schedule = self._svm.get_epoch_schedule()
        epoch, index = schedule.get_epoch_and_slot_index(self._slot)
        return {
            "absoluteSlot": self._slot,
            "blockHeight": self._slot,
            "epoch": epoch,
            "slotIndex": index,
            "slotsInEpoch": schedule.get_slots_in_epoch(epoch),
            "transactionCount": self._tx_count,
        }

    def _rpc_get_health(self, params: list) -> Any:
        return "ok"

    def _rpc_get_version(self, params: list) -> Any:
        return {"solana-core": SOLANA_CORE_VERSION, "feature-set": FEATURE_SET}

    def _rpc_get_genesis_hash(self, params: list) -> Any:
        return self.GENESIS_HASH

    def _rpc_get_recent_prioritization_fees(self, params: list) -> Any:
        return []  # nobody competes for block space here

    def _rpc_request_airdrop(self, params: list) -> Any:
        address = _pubkey(_param(params, 0, str))
        lamports = _param(params, 1, int)
        if not 0 < lamports <= MAX_RPC_AIRDROP_LAMPORTS:
            raise RpcError(INVALID_PARAMS, f"airdrop must be 1..{MAX_RPC_AIRDROP_LAMPORTS}")
        return self._airdrop(address, lamports)

    def _rpc_get_signature_statuses(self, params: list) -> Any:
        signatures = _param(params, 0, list)
        if len(signatures) > MAX_SIGNATURE_STATUSES:
            raise RpcError(INVALID_PARAMS, f"Too many inputs provided; max {MAX_SIGNATURE_STATUSES}")
        # Without it Solana answers from its status cache only (recent blockhashes); with it,
        # from the ledger too.
        search_history = bool(_config(params, 1).get("searchTransactionHistory", False))
        value = []
        for raw in signatures:
            signature = str(Signature.from_string(raw))
            status = self._statuses.get(signature)
            landed = self._history.get(signature) if search_history else None
            if status is None and landed is not None:
                status = _Status(landed.slot, landed.err, landed.slot)
            value.append(None if status is None else _status_json(status))
        return self._with_context(value)

    def _rpc_get_transaction(self, params: list) -> Any:
        signature = str(Signature.from_string(_param(params, 0, str)))
        config = _config(params, 1)
        encoding = config.get("encoding") or "json"
        if encoding not in ("base64", "base58"):
            raise RpcError(INVALID_PARAMS, f"Invalid params: this devnet answers getTransaction in "
                           f"base64 or base58, not {encoding}")
        landed = self._history.get(signature)
        if landed is None or landed.tx is None:
            return None
        version: Any = 0 if isinstance(landed.tx.message, MessageV0) else "legacy"
        supported = config.get("maxSupportedTransactionVersion")
        if version == 0 and (not isinstance(supported, int) or supported < 0):
            raise RpcError(
                UNSUPPORTED_TRANSACTION_VERSION,
                "Transaction version (0) is not supported by the requesting client. Please try the "
                "request again with the following configuration parameter: "
                '"maxSupportedTransactionVersion": 0',
            )
        raw = bytes(landed.tx)
        data = base64.b64encode(raw).decode() if encoding == "base64" else encode_base58(raw)
        return {
            "slot": landed.slot,
            "blockTime": self._block_time(landed.slot),
            "version": version,
            "transaction": [data, encoding],
            # Inner instructions, token balances and rewards are not kept here.
            "meta": {
                "err": landed.err,
                "status": {"Ok": None} if landed.err is None else {"Err": landed.err},
                "fee": landed.fee,
                "preBalances": list(landed.pre_balances),
                "postBalances": list(landed.post_balances),
                "logMessages": list(landed.logs),
                "computeUnitsConsumed": landed.units_consumed,
            },
        }

    def _rpc_get_signatures_for_address(self, params: list) -> Any:
        address = str(_pubkey(_param(params, 0, str)))
        config = _config(params, 1)
        limit = config.get("limit", MAX_SIGNATURES_FOR_ADDRESS)
        if type(limit) is not int or not 0 < limit <= MAX_SIGNATURES_FOR_ADDRESS:
            raise RpcError(INVALID_PARAMS, f"Invalid limit; max {MAX_SIGNATURES_FOR_ADDRESS}")
        signatures = self._by_address.get(address, [])
        end, start = len(signatures), 0
        if config.get("before") is not None:  # newest first: older than `before`, exclusive
            before = str(Signature.from_string(config["before"]))
            end = signatures.index(before) if before in signatures else 0
        if config.get("until") is not None:  # ... and newer than `until`, exclusive
            until = str(Signature.from_string(config["until"]))
            start = signatures.index(until) + 1 if until in signatures else 0
        value = []
        for signature in reversed(signatures[start:end][-limit:]):
            landed = self._history[signature]
            value.append({
                "signature": signature,
                "slot": landed.slot,
                "err": landed.err,
                "memo": _memo(landed.tx),
                "blockTime": self._block_time(landed.slot),
                "confirmationStatus": "finalized",
            })
        return value

    def _rpc_simulate_transaction(self, params: list) -> Any:
        config = _config(params, 1)
        tx = _decode_tx(_param(params, 0, str), config.get("encoding"))
        sig_verify = bool(config.get("sigVerify", False))
        replace = bool(config.get("replaceRecentBlockhash", False))
        if sig_verify and replace:
            raise RpcError(INVALID_PARAMS, "sigVerify may not be used with replaceRecentBlockhash")
        outcome = self._execute(tx, simulate=True, sig_verify=sig_verify, check_age=not replace)
        if outcome.err == "SignatureFailure":
            raise RpcError(SIGNATURE_FAILURE, "Transaction signature verification failure")
        if outcome.err == "SanitizeFailure":
            raise RpcError(INVALID_PARAMS, f"invalid transaction: {_ERROR_TEXT['SanitizeFailure']}")
        value = self._simulation_json(outcome, config.get("accounts"))
        if replace:
            blockhash, slot = self._issue_blockhash()
            value["replacementBlockhash"] = {
                "blockhash": str(blockhash),
                "lastValidBlockHeight": slot + self._lifetime,
            }
        return self._with_context(value)

    def _rpc_send_transaction(self, params: list) -> Any:
        config = _config(params, 1)
        tx = _decode_tx(_param(params, 0, str), config.get("encoding"))
        if not config.get("skipPreflight", False):
            preflight = self._execute(tx, simulate=True, sig_verify=True, check_age=True)
            self._raise_send_failure(preflight, "Transaction simulation failed")
        if not self._auto_process:
            return self._enqueue(tx)
        outcome = self._execute(tx, simulate=False, sig_verify=True, check_age=True)
        if not outcome.landed:
            # A node would drop it silently and the sender would wait for a confirmation that
            # never comes; with no leader to forward to, say so at once.
            self._raise_send_failure(outcome, "Transaction failed")
        # Landed, possibly with an error (the fee is charged): that is what getSignatureStatuses
        # reports, as on a real cluster.
        return outcome.signature

    def _enqueue(self, tx: VersionedTransaction) -> str:
        """Hold a transaction for devnet_processQueued; what a node refuses on arrival is refused."""
        signature = str(tx.signatures[0]) if tx.signatures else str(Signature.default())
        if signature in self._queue:
            return signature  # a resend, as clients retry: queued once
        checked = self._execute(tx, simulate=True, sig_verify=True, check_age=False)
        if checked.err in ("SanitizeFailure", "SignatureFailure", "AlreadyProcessed"):
            self._raise_send_failure(checked, "Transaction failed")
        if len(self._queue) >= MAX_QUEUED_TRANSACTIONS:
            raise RpcError(SEND_FAILURE, f"the queue holds {MAX_QUEUED_TRANSACTIONS} transactions; "
                           "run devnet_processQueued")
        self._queue[signature] = tx
        return signature

    def _process_queue(self) -> list[dict[str, Any]]:
        """Run the queued transactions in arrival order; what each did."""
        queued, self._queue = self._queue, {}
        done = []
        for signature, tx in queued.items():
            outcome = self._execute(tx, simulate=False, sig_verify=True, check_age=True)
            done.append({"signature": signature, "landed": outcome.landed, "err": outcome.err})
        return done

    def _rpc_set_auto_process(self, params: list) -> Any:
        on = _param(params, 0, bool)
        if on and not self._auto_process:
            self._process_queue()
        self._auto_process = on
        return None

    def _rpc_process_queued(self, params: list) -> Any:
        return self._process_queue()

    def _raise_send_failure(self, outcome: _Outcome, prefix: str) -> None:
        if outcome.err is None:
            return
        if outcome.err == "SignatureFailure":
            raise RpcError(SIGNATURE_FAILURE, "Transaction signature verification failure")
        if outcome.err == "SanitizeFailure":
            raise RpcError(INVALID_PARAMS, f"invalid transaction: {_ERROR_TEXT['SanitizeFailure']}")
        raise RpcError(
            SEND_FAILURE,
            f"{prefix}: {_describe_err(outcome.err)}",
            self._simulation_json(outcome, None),
        )

    def _simulation_json(self, outcome: _Outcome, accounts_config: Any) -> dict[str, Any]:
        accounts = None
        if isinstance(accounts_config, dict) and outcome.err is None:
            encoding = {"encoding": accounts_config.get("encoding", "base64")}
            post = outcome.post_accounts or {}
            accounts = []
            for raw in accounts_config.get("addresses", []):
                address = _pubkey(raw)
                account = post.get(address, self._svm.get_account(address))
                accounts.append(self._account_json(account, encoding))
        return_data = None
        if outcome.return_data is not None and bytes(outcome.return_data.data):
            return_data = {
                "programId": str(outcome.return_data.program_id),
                "data": [base64.b64encode(bytes(outcome.return_data.data)).decode(), "base64"],
            }
        return {
            "err": outcome.err,
            "logs": outcome.logs,
            "accounts": accounts,
            "unitsConsumed": outcome.units_consumed,
            "returnData": return_data,
            "innerInstructions": None,
            "replacementBlockhash": None,
        }

    def _encode_account(self, address: Pubkey, config: dict[str, Any]) -> Any:
        return self._account_json(self._svm.get_account(address), config)

    def _account_json(self, account: Account | None, config: dict[str, Any]) -> Any:
        if account is None:
            return None
        data = bytes(account.data)
        encoding = config.get("encoding") or "base64"
        data_slice = config.get("dataSlice")
        parsed = None
        if encoding == "jsonParsed":
            parsed = self._parse_spl(account)
            encoding = "base64"  # Solana falls back to base64 when it has no parser
        if parsed is not None:
            encoded: Any = parsed
        else:
            if isinstance(data_slice, dict):
                offset = int(data_slice.get("offset", 0))
                data = data[offset : offset + int(data_slice.get("length", len(data)))]
            if encoding == "base64":
                encoded = [base64.b64encode(data).decode(), "base64"]
            elif encoding in ("base58", "binary"):
                if len(data) > 128:
                    raise RpcError(
                        INVALID_PARAMS,
                        "Encoded binary (base 58) data should be less than 128 bytes, "
                        "please use Base64 encoding.",
                    )
                encoded = [_base58(data), "base58"] if encoding == "base58" else _base58(data)
            else:
                raise RpcError(INVALID_PARAMS, f"Invalid params: unsupported encoding {encoding}")
        return {
            "data": encoded,
            "executable": account.executable,
            "lamports": account.lamports,
            "owner": str(account.owner),
            "rentEpoch": account.rent_epoch,
            "space": len(account.data),
        }

    def _parse_spl(self, account: Account) -> dict[str, Any] | None:
        """jsonParsed for SPL Token mints and token accounts (the ones clients ask about)."""
        if account.owner != TOKEN_PROGRAM:
            return None
        data = bytes(account.data)
        if len(data) == MINT_LEN:
            mint = Mint.from_bytes(data)
            info: dict[str, Any] = {
                "decimals": mint.decimals,
                "freezeAuthority": _opt_str(mint.freeze_authority),
                "isInitialized": mint.is_initialized,
                "mintAuthority": _opt_str(mint.mint_authority),
                "supply": str(mint.supply),
            }
            kind = "mint"
        elif len(data) == TOKEN_ACCOUNT_LEN:
            token = TokenAccount.from_bytes(data)
            info = {
                "isNative": token.is_native is not None,
                "mint": str(token.mint),
                "owner": str(token.owner),
                "state": "frozen" if int(token.state) == 2 else "initialized",
                "tokenAmount": _ui_amount(token.amount, self._decimals(token.mint)),
            }
            kind = "account"
        else:
            return None
        return {
            "program": "spl-token",
            "parsed": {"info": info, "type": kind},
            "space": len(data),
        }

    def _decimals(self, mint: Pubkey) -> int:
        account = self._svm.get_account(mint)
        if account is None or len(account.data) < MINT_LEN:
            return 0
        return Mint.from_bytes(bytes(account.data)[:MINT_LEN]).decimals

    # ------------------------------------------------------------------ the chain

    def _tick(self) -> None:
        """Advance the slot with the clock and forget blockhashes (and statuses) past their life."""
        slot = max(self._slot, int((self._clock() - self._t0) / SLOT_SECONDS))
        if slot == self._slot:
            return
        self._slot = slot
        clock = self._svm.get_clock()
        clock.slot = slot
        clock.unix_timestamp = self._unix0 + int(slot * SLOT_SECONDS)
        self._svm.set_clock(clock)
        oldest = slot - self._lifetime
        while self._blockhashes:
            first = next(iter(self._blockhashes))
            if self._blockhashes[first] >= oldest:
                break
            del self._blockhashes[first]
        while self._statuses:
            first_sig = next(iter(self._statuses))
            if self._statuses[first_sig].blockhash_slot >= oldest:
                break
            del self._statuses[first_sig]

    def _issue_blockhash(self) -> tuple[Hash, int]:
        self._tick()
        blockhash = Hash(hashlib.sha256(self._seed + self._slot.to_bytes(8, "little")).digest())
        self._blockhashes.setdefault(blockhash, self._slot)
        return blockhash, self._slot

    def _blockhash_valid(self, blockhash: Hash) -> bool:
        self._tick()
        slot = self._blockhashes.get(blockhash)
        return slot is not None and self._slot - slot <= self._lifetime

    def _execute(
        self, tx: VersionedTransaction, *, simulate: bool, sig_verify: bool, check_age: bool
    ) -> _Outcome:
        """Run or simulate one transaction with Solana's checks, in Solana's order."""
        with self._lock:
            self._tick()
            signature = str(tx.signatures[0]) if tx.signatures else str(Signature.default())
            try:
                tx.sanitize()
            except Exception:
                return _Outcome(signature, "SanitizeFailure", [], 0, landed=False)
            if sig_verify and not all(tx.verify_with_results()):
                return _Outcome(signature, "SignatureFailure", [], 0, landed=False)
            blockhash = tx.message.recent_blockhash
            if check_age and not self._blockhash_valid(blockhash):
                return _Outcome(signature, "BlockhashNotFound", [], 0, landed=False)
            if signature in self._statuses:
                return _Outcome(signature, "AlreadyProcessed", [], 0, landed=False)
            if simulate:
                self._svm.with_sigverify(sig_verify)
                try:
                    result = self._svm.simulate_transaction(tx)
                finally:
                    self._svm.with_sigverify(True)
                if isinstance(result, SimulatedTransactionInfo):
                    meta = result.meta()
                    return _Outcome(
                        signature,
                        None,
                        list(meta.logs()),
                        meta.compute_units_consumed(),
                        landed=False,
                        return_data=meta.return_data(),
                        post_accounts=dict(result.post_accounts()),
                    )
                meta = result.meta()
                return _Outcome(
                    signature,
                    _err_json(result.err()),
                    list(meta.logs()),
                    meta.compute_units_consumed(),
                    landed=False,
                )
            keys = list(tx.message.account_keys)
            pre_balances = tuple(self._svm.get_balance(key) or 0 for key in keys)
            result = self._svm.send_transaction(tx)
            meta = result if isinstance(result, TransactionMetadata) else result.meta()
            err = None if isinstance(result, TransactionMetadata) else _err_json(result.err())
            # A failed transaction that paid its fee is on chain (and in LiteSVM's history).
            landed = err is None or self._svm.get_transaction(tx.signatures[0]) is not None
            if landed:
                self._charge_priority_fee(tx.message)
                landed_tx = _Landed(
                    self._slot,
                    err,
                    tx,
                    LAMPORTS_PER_SIGNATURE * len(tx.signatures) + _priority_fee(tx.message),
                    pre_balances,
                    tuple(self._svm.get_balance(key) or 0 for key in keys),
                    tuple(meta.logs()),
                    meta.compute_units_consumed(),
                )
                self._record(signature, err, self._blockhashes.get(blockhash, self._slot), landed_tx)
            return _Outcome(
                signature,
                err,
                list(meta.logs()),
                meta.compute_units_consumed(),
                landed=landed,
                return_data=meta.return_data(),
            )

    def _charge_priority_fee(self, message: Any) -> None:
        """Charge the compute-unit price, which LiteSVM leaves out (it charges signatures only)."""
        fee = _priority_fee(message)
        payer = message.account_keys[0]
        account = self._svm.get_account(payer)
        if fee and account is not None:
            self._svm.set_account(
                payer,
                Account(
                    lamports=max(account.lamports - fee, 0),
                    data=bytes(account.data),
                    owner=account.owner,
                    executable=account.executable,
                    rent_epoch=account.rent_epoch,
                ),
            )

    def _record(self, signature: str, err: Any, blockhash_slot: int, landed: _Landed | None = None) -> None:
        self._statuses[signature] = _Status(self._slot, err, blockhash_slot)
        self._history[signature] = landed or _Landed(self._slot, err)
        if landed is not None and landed.tx is not None:
            for key in dict.fromkeys(landed.tx.message.account_keys):
                self._by_address.setdefault(str(key), []).append(signature)
        self._tx_count += 1

    def _block_time(self, slot: int) -> int:
        """The unix time of a slot, as `_tick` sets the clock sysvar."""
        return self._unix0 + int(slot * SLOT_SECONDS)

    def _run_internal(self, instructions: list[Instruction], signers: list[Keypair]) -> str:
        """Sign and land a devnet housekeeping transaction; raise if it fails."""
        with self._lock:
            # A memo nonce keeps two identical requests in one slot from being one transaction.
            self._memo_counter += 1
            memo = Instruction(MEMO_PROGRAM, f"paywire devnet #{self._memo_counter}".encode(), [])
            blockhash, _ = self._issue_blockhash()
            message = MessageV0.try_compile(signers[0].pubkey(), [*instructions, memo], [], blockhash)
            outcome = self._execute(
                VersionedTransaction(message, signers),
                simulate=False,
                sig_verify=True,
                check_age=True,
            )
            if outcome.err is not None:
                raise RuntimeError(
                    f"devnet transaction failed: {_describe_err(outcome.err)}; logs: {outcome.logs[-3:]}"
                )
            return outcome.signature

    def _airdrop(self, address: Pubkey, lamports: int) -> str:
        if lamports <= 0:
            raise ValueError("lamports must be positive")
        with self._lock:
            self._tick()
            # LiteSVM signs airdrops with its own (otherwise unused) blockhash: move it on so
            # two equal airdrops to one address are two transactions, not a replay.
            self._svm.expire_blockhash()
            result = self._svm.airdrop(address, lamports)
            if not isinstance(result, TransactionMetadata):
                raise RuntimeError(f"airdrop failed: {_describe_err(_err_json(result.err()))}")
            signature = str(result.signature())
            self._record(signature, None, self._slot)
            return signature

    def _create_mint(self) -> None:
        mint = Mint(
            mint_authority=self._mint_authority.pubkey(),
            supply=0,
            decimals=self.USDC_DECIMALS,
            is_initialized=True,
            freeze_authority=None,
        )
        data = bytes(mint)
        self._svm.set_account(
            self._mint,
            Account(
                lamports=self._svm.minimum_balance_for_rent_exemption(len(data)),
                data=data,
                owner=TOKEN_PROGRAM,
                executable=False,
                rent_epoch=U64_MAX,
            ),
        )

    def _ata(self, owner: Pubkey) -> Pubkey:
        return get_associated_token_address(owner, self._mint, TOKEN_PROGRAM)

    def _create_ata_ix(self, owner: Pubkey) -> Instruction:
        """ATA program CreateIdempotent, rent paid by the mint authority."""
        return Instruction(
            ATA_PROGRAM,
            bytes([1]),
            [
                AccountMeta(self._mint_authority.pubkey(), is_signer=True, is_writable=True),
                AccountMeta(self._ata(owner), is_signer=False, is_writable=True),
                AccountMeta(owner, is_signer=False, is_writable=False),
                AccountMeta(self._mint, is_signer=False, is_writable=False),
                AccountMeta(SYSTEM_PROGRAM, is_signer=False, is_writable=False),
                AccountMeta(TOKEN_PROGRAM, is_signer=False, is_writable=False),
            ],
        )

    # ------------------------------------------------------------------ for the signer

    def _check_network(self, network: str) -> None:
        # A devnet signature must never pass for another network's, mainnet least of all.
        if network not in (self.NETWORK, self.V1_NETWORK):
            raise ValueError(f"this devnet only runs {self.NETWORK}, not {network}")

    def _status(self, signature: str) -> _Status | None:
        with self._lock:
            self._tick()
            return self._statuses.get(signature)


class DevnetFacilitatorSigner:
    """The SDK's `FacilitatorSvmSigner` protocol over an in-process `SolanaDevnet`.

    Same contract as the SDK's `FacilitatorKeypairSigner`, minus the HTTP hop: settlement is
    final as soon as `send_transaction` returns, so confirmation never waits.
    """

    def __init__(self, devnet: SolanaDevnet, fee_payer: Keypair) -> None:
        self._devnet = devnet
        self._keypair = fee_payer
        self._address = str(fee_payer.pubkey())

    def get_addresses(self) -> list[str]:
        return [self._address]

    def fee_payer_signature(self, tx: VersionedTransaction) -> str | None:
        """The transaction's id once signed by the fee payer (known before it is sent)."""
        if tx.message.account_keys[0] != self._keypair.pubkey():
            return None
        return str(self._keypair.sign_message(to_bytes_versioned(tx.message)))

    def sign_transaction(self, tx_base64: str, fee_payer: str, network: str) -> str:
        """Add the fee payer's signature to a transaction the client partially signed."""
        self._devnet._check_network(network)
        if fee_payer != self._address:
            raise ValueError(f"No signer for fee payer {fee_payer}. Available: {self._address}")
        tx = VersionedTransaction.from_bytes(base64.b64decode(tx_base64))
        message = tx.message
        # Sign only as the fee payer (first account), never as any other signer.
        if not tx.signatures or message.account_keys[0] != self._keypair.pubkey():
            raise ValueError(f"the transaction's fee payer is not {self._address}")
        signatures = list(tx.signatures)
        signatures[0] = self._keypair.sign_message(to_bytes_versioned(message))
        signed = VersionedTransaction.populate(message, signatures)
        return base64.b64encode(bytes(signed)).decode()

    def simulate_transaction(self, tx_base64: str, network: str) -> None:
        self._devnet._check_network(network)
        tx = VersionedTransaction.from_bytes(base64.b64decode(tx_base64))
        outcome = self._devnet._execute(tx, simulate=True, sig_verify=True, check_age=True)
        if outcome.err is not None:
            raise RuntimeError(
                f"Simulation failed: {json.dumps(outcome.err)} ({_describe_err(outcome.err)}); "
                f"logs: {outcome.logs[-3:]}"
            )

    def send_transaction(self, tx_base64: str, network: str) -> str:
        self._devnet._check_network(network)
        tx = VersionedTransaction.from_bytes(base64.b64decode(tx_base64))
        traced = trace()
        if traced is not None:
            traced.sending(str(tx.signatures[0]))
        outcome = self._devnet._execute(tx, simulate=False, sig_verify=True, check_age=True)
        if traced is not None and (outcome.landed or outcome.err is None):
            traced.accepted()
        elif traced is not None:
            traced.refused()
        if outcome.err is not None:
            # Terminal: the chain has processed (or refused) it, there is nothing to wait for.
            landed = " (landed, fee charged)" if outcome.landed else ""
            raise RuntimeError(
                f"Transaction failed{landed}: {json.dumps(outcome.err)} "
                f"({_describe_err(outcome.err)}); logs: {outcome.logs[-3:]}"
            )
        return outcome.signature

    def confirm_transaction(self, signature: str, network: str) -> None:
        self._devnet._check_network(network)
        status = self._devnet._status(signature)
        if status is None:
            raise RuntimeError(f"Transaction {signature} not found")
        if status.err is not None:
            raise RuntimeError(f"Transaction failed: {json.dumps(status.err)}")


# ---------------------------------------------------------------------- helpers

_RPC_METHODS: dict[str, Callable[[SolanaDevnet, list], Any]] = {
    "getAccountInfo": SolanaDevnet._rpc_get_account_info,
    "getMultipleAccounts": SolanaDevnet._rpc_get_multiple_accounts,
    "getBalance": SolanaDevnet._rpc_get_balance,
    "getTokenAccountBalance": SolanaDevnet._rpc_get_token_account_balance,
    "getTokenSupply": SolanaDevnet._rpc_get_token_supply,
    "getMinimumBalanceForRentExemption": SolanaDevnet._rpc_get_minimum_balance_for_rent_exemption,
    "getLatestBlockhash": SolanaDevnet._rpc_get_latest_blockhash,
    "isBlockhashValid": SolanaDevnet._rpc_is_blockhash_valid,
    "getSlot": SolanaDevnet._rpc_get_slot,
    "getBlockHeight": SolanaDevnet._rpc_get_slot,  # no skipped slots: height == slot
    "getEpochInfo": SolanaDevnet._rpc_get_epoch_info,
    "getHealth": SolanaDevnet._rpc_get_health,
    "getVersion": SolanaDevnet._rpc_get_version,
    "getGenesisHash": SolanaDevnet._rpc_get_genesis_hash,
    "getRecentPrioritizationFees": SolanaDevnet._rpc_get_recent_prioritization_fees,
    "requestAirdrop": SolanaDevnet._rpc_request_airdrop,
    "getSignatureStatuses": SolanaDevnet._rpc_get_signature_statuses,
    "getTransaction": SolanaDevnet._rpc_get_transaction,
    "getSignaturesForAddress": SolanaDevnet._rpc_get_signatures_for_address,
    "simulateTransaction": SolanaDevnet._rpc_simulate_transaction,
    "sendTransaction": SolanaDevnet._rpc_send_transaction,
    "devnet_setAutoProcess": SolanaDevnet._rpc_set_auto_process,
    "devnet_processQueued": SolanaDevnet._rpc_process_queued,
}


def _param(params: list, index: int, kind: type) -> Any:
    if len(params) <= index:
        raise RpcError(INVALID_PARAMS, f"Invalid params: missing parameter {index}")
    value = params[index]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RpcError(INVALID_PARAMS, f"Invalid params: parameter {index} must be {kind.__name__}")
    return value


def _config(params: list, index: int) -> dict[str, Any]:
    if len(params) <= index or params[index] is None:
        return {}
    if not isinstance(params[index], dict):
        raise RpcError(INVALID_PARAMS, "Invalid params: configuration must be an object")
    return params[index]


def _pubkey(address: str) -> Pubkey:
    """Parse a base58 address; ValueError (not a Rust panic type) when it is not one."""
    try:
        return Pubkey.from_string(address)
    except Exception as exc:
        raise ValueError(f"invalid Solana address {address!r}") from exc


def _decode_tx(raw: str, encoding: str | None) -> VersionedTransaction:
    encoding = encoding or "base58"  # Solana's (deprecated) default
    try:
        if encoding == "base64":
            data = base64.b64decode(raw, validate=True)
        elif encoding == "base58":
            data = decode_base58(raw)
        else:
            raise RpcError(INVALID_PARAMS, f"Invalid params: unsupported encoding {encoding}")
        return VersionedTransaction.from_bytes(data)
    except RpcError:
        raise
    except Exception as exc:
        raise RpcError(INVALID_PARAMS, f"failed to deserialize solana_transaction::versioned: {exc}") from exc


def _err_json(err: Any) -> Any:
    """Solana's JSON form of a TransactionError, produced by solders' own serde."""
    body = SimulateTransactionResp(RpcSimulateTransactionResult(err=err), RpcResponseContext(0))
    return json.loads(body.to_json())["result"]["value"]["err"]


def _describe_err(err: Any) -> str:
    if isinstance(err, str):
        return _ERROR_TEXT.get(err, err)
    if isinstance(err, dict) and "InstructionError" in err:
        index, detail = err["InstructionError"]
        if isinstance(detail, dict) and "Custom" in detail:
            detail = f"custom program error: {hex(detail['Custom'])}"
        return f"Error processing Instruction {index}: {detail}"
    return json.dumps(err)


def _priority_fee(message: Any) -> int:
    """Solana's prioritization fee: ceil(compute unit limit x price in micro-lamports / 1e6)."""
    keys = list(message.account_keys)
    limit, price, others = None, 0, 0
    for ix in message.instructions:
        data = bytes(ix.data)
        if keys[ix.program_id_index] != COMPUTE_BUDGET_PROGRAM:
            others += 1
        elif data[:1] == b"\x02" and len(data) >= 5:
            limit = int.from_bytes(data[1:5], "little")
        elif data[:1] == b"\x03" and len(data) >= 9:
            price = int.from_bytes(data[1:9], "little")
    if limit is None:
        limit = 200_000 * others  # Solana's default per non-compute-budget instruction
    return -(-min(limit, 1_400_000) * price // 1_000_000)


def _status_json(status: _Status) -> dict[str, Any]:
    return {
        "slot": status.slot,
        "confirmations": None,  # rooted at once: nothing forks here
        "status": {"Ok": None} if status.err is None else {"Err": status.err},
        "err": status.err,
        "confirmationStatus": "finalized",
    }


def _ui_amount(amount: int, decimals: int) -> dict[str, Any]:
    value = Decimal(amount).scaleb(-decimals)
    text = format(value.normalize(), "f") if amount else "0"
    return {
        "amount": str(amount),
        "decimals": decimals,
        "uiAmount": float(value),
        "uiAmountString": text,
    }


def _memo(tx: VersionedTransaction | None) -> str | None:
    """getSignaturesForAddress's `memo`: each Memo instruction as "[length] text", joined by "; "."""
    if tx is None:
        return None
    keys = tx.message.account_keys
    memos = [bytes(ix.data) for ix in tx.message.instructions if keys[ix.program_id_index] == MEMO_PROGRAM]
    return "; ".join(f"[{len(data)}] {data.decode(errors='replace')}" for data in memos) or None


def _opt_str(value: Pubkey | None) -> str | None:
    return None if value is None else str(value)


def _base58(data: bytes) -> str:
    """The SDK's base58, but one "1" per zero byte for all-zero data (x402 2.25 adds one more)."""
    return encode_base58(data) if data.strip(b"\0") else "1" * len(data)
