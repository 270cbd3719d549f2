"""The fault-injection harness: persistent chains, gateway processes, a client that retries as a
real one would, and the invariant each test checks for every payment it made.

- Chains outlive every gateway: anvil with DevUSDC for EVM (`EvmChain`), `paywire devnet` as its
  own process for Solana (`SolanaChain`).
- Gateways are `paywire serve` processes in production mode (`Gateway`): one on a SQLite file, or
  replicas sharing one PostgreSQL database (`Deployment`); a crash point is planned per start
  with `PAYWIRE_FAILPOINTS` (payments/failpoints.py).
- Payments are signed with the x402 SDK's client by fresh payers funded on chain (`sign_payments`).
- `Client` resends the identical request with the same payment on a transport error, 409
  `payment_in_progress` and 503 `settlement_pending`, `ledger_unavailable` or
  `facilitator_unavailable` (after Retry-After), to the next replica, until a final answer or its
  deadline.
- `check` compares, for every payment, the chain (EIP-3009 `authorizationState`, the Solana
  transaction's status, the merchant's balances) with the ledger rows and with what the client
  got, and prints the counts. Money problems raise `Violation`; rows left unfinished past the
  reconciler's lease raise `Unfinished`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_utils import to_checksum_address
from solders.keypair import Keypair
from solders.message import to_bytes_versioned
from solders.transaction import VersionedTransaction

from payments.codec import decode_base64_any
from payments.devnet.evm import load_artifact
from tests.support.evm_anvil import AnvilNode, AnvilUsdc
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LedgerReader
from tests.support.paying import EVM_NET, SOL_NET, client_for, header, quote, sign
from tests.support.reports import report
from tests.support.served_process import PAYWIRE, ROOT, paywire_env, reserved_port, start_paywire, stop

RESOURCE = "/v1/marketplace/api/token-count-508"  # cheap, local, no upstream
LEASE_SECONDS = 2.0
RECONCILE_SECONDS = 0.5
PENDING_RETRY_SECONDS = 1
RECEIPT_TIMEOUT_SECONDS = 2.0
# uvicorn closes a keep-alive connection idle for 5 s; a client that reuses one at that moment
# gets "server disconnected". Clients here let theirs go after 2 s idle instead.
KEEP_ALIVE = httpx.Limits(keepalive_expiry=2.0)
# Time the gateways need beyond lease + reconcile interval to act on an expired row (a pass,
# an RPC round trip, a write): the checker's grace after the clients are done.
SLACK_SECONDS = 2.0
# Short settlement timings, so a dead replica's payments are taken over within seconds.
SETTLEMENT_ENV = {
    "PAYWIRE_SETTLEMENT_LEASE_SECONDS": str(LEASE_SECONDS),
    "PAYWIRE_RECONCILE_INTERVAL_SECONDS": str(RECONCILE_SECONDS),
    "PAYWIRE_PENDING_RETRY_SECONDS": str(PENDING_RETRY_SECONDS),
    "PAYWIRE_SETTLEMENT_RECEIPT_TIMEOUT_SECONDS": str(RECEIPT_TIMEOUT_SECONDS),
}
UNFINISHED = ("claimed", "settling", "pending")


def _evm_key() -> str:
    return "0x" + bytes(Account.create().key).hex()


def _wait(condition: Callable[[], bool], what: str, timeout: float, interval: float = 0.05) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` past the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)  # polling with a deadline


# ---------------------------------------------------------------------------------- chains


class EvmChain:
    """anvil with DevUSDC at Base Sepolia's USDC address."""

    def __init__(self, node: AnvilNode) -> None:
        self.node = node
        self.usdc = AnvilUsdc(node, facilitator_key=_evm_key(), minter_key=_evm_key())
        self._token = node.web3().eth.contract(address=AnvilUsdc.USDC_ADDRESS,
                                               abi=load_artifact()["abi"])

    @property
    def url(self) -> str:
        return self.node.url

    def new_payer(self, funds: int) -> str:
        """A fresh key holding `funds` USDC (atomic units)."""
        key = _evm_key()
        self.usdc.mint(Account.from_key(key).address, funds)
        return key

    def gas_key(self) -> str:
        """A fresh key with gas money (another facilitator's)."""
        key = _evm_key()
        self.usdc.fund_gas(Account.from_key(key).address, 10**21)
        return key

    def authorization_used(self, payer: str, nonce: str) -> bool:
        """EIP-3009: was this authorization used on chain (the money moved)?"""
        return bool(self._token.functions.authorizationState(
            to_checksum_address(payer), bytes.fromhex(nonce.removeprefix("0x"))).call())

    def transaction_ok(self, tx: str) -> bool:
        receipt = self.node.rpc("eth_getTransactionReceipt", [tx])
        return receipt is not None and receipt["status"] == "0x1"

    def pause(self) -> None:
        """Stop mining: transactions wait (their hash is known, their receipt is null)."""
        self.node.rpc("evm_setAutomine", [False])

    def resume(self) -> None:
        """Mine what waits, in one block, and mine every transaction at once again."""
        self.node.rpc("evm_mine", [])
        self.node.rpc("evm_setAutomine", [True])


class SolanaChain:
    """`paywire devnet` as its own process: its Solana chain and fee payer (the gateways')."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        env_file, self.log_path = folder / "devnet.env", folder / "devnet.log"
        self._local = threading.local()
        with self.log_path.open("w") as sink:
            self.proc = subprocess.Popen(
                [*PAYWIRE, "devnet", "--port", "0", "--data-dir", str(folder / "data"),
                 "--env-file", str(env_file), "--log-level", "warning"],
                env=paywire_env(folder / "unused"), cwd=ROOT, stdout=sink,
                stderr=subprocess.STDOUT, text=True)
        try:
            _wait(lambda: env_file.exists() or self.proc.poll() is not None, "devnet env file", 60)
            assert self.proc.poll() is None, self.log_path.read_text()
            lines = [ln for ln in env_file.read_text().splitlines() if ln and not ln.startswith("#")]
            self.env: dict[str, str] = dict(line.split("=", 1) for line in lines)
            self.rpc_url = self.env["PAYWIRE_SOLANA_RPC_URL"]
            self.url = self.rpc_url.removesuffix("/devnet/solana")
            self.facilitator_key = self.env["PAYWIRE_SOLANA_FACILITATOR_KEY"]
            self.fee_payer = Keypair.from_base58_string(self.facilitator_key)
            _wait(self._healthy, "devnet /healthz", 60)
        except BaseException:
            self.close()
            raise

    @property
    def _http(self) -> httpx.Client:
        """A client per thread (scenarios run side by side)."""
        if not hasattr(self._local, "http"):
            self._local.http = httpx.Client(timeout=30, limits=KEEP_ALIVE)
        return self._local.http

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return self._http.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def rpc(self, method: str, params: list[Any] | None = None) -> Any:
        reply = self._http.post(self.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                    "params": params or []}).json()
        assert "error" not in reply, reply
        return reply["result"]

    def new_payer(self, funds: int) -> Keypair:
        payer = Keypair()
        answer = self._http.post(f"{self.url}/devnet/faucet", json={
            "network": SOL_NET, "address": str(payer.pubkey()), "amount": funds})
        assert answer.status_code == 200, answer.text
        return payer

    def balance(self, address: str) -> int:
        answer = self._http.get(f"{self.url}/devnet/balance",
                                params={"network": SOL_NET, "address": address})
        assert answer.status_code == 200, answer.text
        return int(answer.json()["balance"])

    def statuses(self, signatures: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """Each transaction's status, history included (None: it never landed)."""
        out: dict[str, dict[str, Any] | None] = {}
        for start in range(0, len(signatures), 100):
            chunk = list(signatures[start:start + 100])
            value = self.rpc("getSignatureStatuses",
                             [chunk, {"searchTransactionHistory": True}])["value"]
            out |= dict(zip(chunk, value, strict=True))
        return out

    def pause(self) -> None:
        """Stop processing: `sendTransaction` queues, statuses answer null."""
        self.rpc("devnet_setAutoProcess", [False])

    def resume(self) -> None:
        """Run what waits, in order, and process every transaction at once again."""
        self.rpc("devnet_processQueued")
        self.rpc("devnet_setAutoProcess", [True])

    def close(self) -> None:
        stop(self.proc)


@dataclass
class Chains:
    evm: EvmChain
    solana: SolanaChain

    def deployment_env(self, *, facilitator_url: str | None = None) -> dict[str, str]:
        """A production-mode gateway settling on both chains, paying merchants of its own (so
        deployments tested side by side keep separate balances): an in-process facilitator with
        an EVM key of its own (replicas share it; other deployments do not) and the devnet's
        Solana fee payer, or a remote facilitator (the RPC URLs stay: the reconciler asks the
        chains through them)."""
        sol_merchant = self.solana.new_payer(1)  # the faucet opens its token account
        env = {
            "PAYWIRE_NETWORKS": "base-sepolia,solana-devnet",
            "PAYWIRE_EVM_RPC_URL": self.evm.url,
            "PAYWIRE_SOLANA_RPC_URL": self.solana.rpc_url,
            "PAYWIRE_EVM_PAY_TO": Account.create().address,
            "PAYWIRE_SOLANA_PAY_TO": str(sol_merchant.pubkey()),
            **SETTLEMENT_ENV,
        }
        if facilitator_url:
            return env | {"PAYWIRE_FACILITATOR_URL": facilitator_url}
        return env | {"PAYWIRE_EVM_FACILITATOR_KEY": self.evm.gas_key(),
                      "PAYWIRE_SOLANA_FACILITATOR_KEY": self.solana.facilitator_key}


class RpcGate:
    """A JSON-RPC pass-through to a node that can hold every call of one method until released
    (a node that stalls on one request), to stop a settlement at a chosen step: before the call
    reaches the node, or after the node took it (the caller waits for the answer)."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._local = threading.local()
        self._method: str | None = None
        self._forward_first = False
        self._open = threading.Event()
        self._open.set()
        self.held = threading.Event()  # set when a call is being held
        self._server = JsonRpcHttpServer(self._forward).start()
        self.url = self._server.url

    def _forward(self, method: str, params: list[Any]) -> dict[str, Any]:
        hold = method == self._method
        if hold and not self._forward_first:
            self.held.set()
            self._open.wait(60)
        if not hasattr(self._local, "http"):
            self._local.http = httpx.Client(timeout=30, limits=KEEP_ALIVE)
        reply = self._local.http.post(self._target, json={
            "jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()
        if hold and self._forward_first:
            self.held.set()
            self._open.wait(60)
        return {"error": reply["error"]} if "error" in reply else {"result": reply.get("result")}

    def hold(self, method: str, *, forward_first: bool = False) -> None:
        """Hold calls of `method` until `release`: before they reach the node, or (forward_first)
        once the node answered them, keeping the answer."""
        self.held.clear()
        self._open.clear()
        self._forward_first = forward_first
        self._method = method

    def release(self) -> None:
        self._method = None
        self._open.set()

    def close(self) -> None:
        self.release()
        self._server.close()


# -------------------------------------------------------------------------------- gateways


class Gateway:
    """One `paywire serve` process on a fixed loopback port (a restart takes the same port, kept
    for it meanwhile: `reserved_port`)."""

    def __init__(self, name: str, env: dict[str, str], folder: Path) -> None:
        self.name, self.env = name, env
        self.data_dir = folder / name
        self.log_path = folder / f"{name}.log"
        self._port_holder, self.port = reserved_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None
        self.failpoints: str | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, failpoints: str | None = None) -> None:
        """Start it (with `PAYWIRE_FAILPOINTS=failpoints`, if given); return once it is ready."""
        assert not self.alive, f"{self.name} is running"
        env = paywire_env(self.data_dir, **self.env)
        env.pop("PAYWIRE_FAILPOINTS", None)
        if failpoints:
            env["PAYWIRE_FAILPOINTS"] = failpoints
        self.failpoints = failpoints
        began = time.monotonic()
        with self.log_path.open("a") as log:
            log.write(f"--- {self.name} starts (failpoints: {failpoints or 'none'})\n")
            log.flush()
            try:
                self.proc = start_paywire(self.port, env, stdout=log, stderr=log, log_level="info")
            except RuntimeError as exc:
                raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}") from exc
        self._note(f"started in {time.monotonic() - began:.1f} s")
        ready = httpx.get(f"{self.url}/readyz", timeout=30)
        assert ready.status_code == 200, f"{self.name} is not ready: {ready.text}"

    def restart(self, failpoints: str | None = None) -> None:
        """Stop it (if it runs) and start it again, with these failpoints only."""
        if self.alive:
            self.stop()
        self.start(failpoints)

    def wait_killed(self, paying: ClientRun) -> None:
        """Wait for its planned failpoint to SIGKILL it while `paying` pays it. Fails if it exits
        otherwise, or lives on once every payment was answered (the failpoint was not reached):
        how long the payments take before it fires is the machine's speed, so no fixed timeout."""
        assert self.proc is not None
        while True:
            try:
                code = self.proc.wait(timeout=0.1)  # polling the process and the clients
                break
            except subprocess.TimeoutExpired:
                pass
            if paying.finished():
                try:
                    code = self.proc.wait(timeout=5)  # a kill the last answer saw lands at once
                    break
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{self.name}'s failpoint {self.failpoints} did not fire: "
                                         "every payment was answered") from None
        assert code == -signal.SIGKILL, f"{self.name} exited {code}:\n{self.log_tail()}"

    def kill(self) -> None:
        """SIGKILL, as a crash (no shutdown runs)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL
        self._note("killed")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            began = time.monotonic()
            stop(self.proc)
            self._note(f"stopped in {time.monotonic() - began:.1f} s")

    def close(self) -> None:
        """Stop it for good: its port is free again."""
        self.stop()
        self._port_holder.close()

    def _note(self, line: str) -> None:
        with self.log_path.open("a") as log:
            log.write(f"--- {self.name} {line}\n")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class Deployment:
    """Gateways sharing one ledger: one process on a SQLite file (`db_url` None), or replicas on
    one PostgreSQL database. `rows()` reads the ledger through `payments.ledger.Ledger`."""

    def __init__(self, name: str, chains: Chains, folder: Path, *, replicas: int,
                 db_url: str | None = None, env: dict[str, str] | None = None,
                 evm_gate: bool = False) -> None:
        """`evm_gate`: the gateways reach the EVM node through an `RpcGate` (`self.gate`)."""
        self.name, self.chains = name, chains
        base = dict(env if env is not None else chains.deployment_env())
        self.gate = RpcGate(chains.evm.url) if evm_gate else None
        if self.gate is not None:
            base["PAYWIRE_EVM_RPC_URL"] = self.gate.url
        self.merchants = {EVM_NET: base["PAYWIRE_EVM_PAY_TO"], SOL_NET: base["PAYWIRE_SOLANA_PAY_TO"]}
        if db_url is None:
            assert replicas == 1, "SQLite is one process"
            shared = folder / f"{name}-data"
            self.db_url = f"sqlite+aiosqlite:///{(shared / 'paywire.db').resolve()}"
            base["PAYWIRE_DATA_DIR"] = str(shared)
        else:
            self.db_url = db_url
            base["PAYWIRE_DATABASE_URL"] = db_url
        self.gateways = [Gateway(f"{name}-{i}", base, folder) for i in range(replicas)]
        # Replicas behind one load balancer name one public URL (their quotes are identical).
        for gateway in self.gateways:
            gateway.env = base | {"PAYWIRE_PUBLIC_URL": self.gateways[0].url}
        self._reader: LedgerReader | None = None

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    def start(self) -> None:
        """(Re)start every gateway, in parallel, without failpoints."""
        with ThreadPoolExecutor(len(self.gateways)) as pool:
            for done in [pool.submit(g.restart) for g in self.gateways]:
                done.result()

    def ensure_running(self) -> None:
        """Start (without failpoints) the gateways a previous test killed."""
        with ThreadPoolExecutor(len(self.gateways)) as pool:
            for done in [pool.submit(g.restart) for g in self.gateways
                         if not g.alive or g.failpoints]:
                done.result()

    def merchant_balances(self) -> dict[str, int]:
        return {EVM_NET: self.chains.evm.usdc.balance_of(self.merchants[EVM_NET]),
                SOL_NET: self.chains.solana.balance(self.merchants[SOL_NET])}

    def rows(self) -> list[dict[str, Any]]:
        return self._ledger().rows()

    def row(self, payment: Payment) -> dict[str, Any] | None:
        return next((r for r in self.rows()
                     if (r["network"], r["payer"], r["nonce"]) == payment.key), None)

    def events(self, row_id: str) -> list[dict[str, Any]]:
        """The reconciler's decisions on a row (`paywire_payment_events`), newest first."""
        reader = self._ledger()
        return reader.run(reader.ledger.events(row_id))

    def select(self, statement: Any) -> list[dict[str, Any]]:
        """The rows of a query on the ledger's database (any of its tables), as dicts."""
        reader = self._ledger()

        async def read() -> list[dict[str, Any]]:
            async with reader.ledger.reading() as conn:
                return [dict(row) for row in (await conn.execute(statement)).mappings().all()]
        return reader.run(read())

    def write(self, statement: Any) -> int:
        """Run one write on the ledger's database, in its own transaction: the rows it changed."""
        reader = self._ledger()

        async def run() -> int:
            async with reader.ledger.writing() as conn:
                return int((await conn.execute(statement)).rowcount)
        return reader.run(run())

    def _ledger(self) -> LedgerReader:
        if self._reader is None:
            self._reader = LedgerReader(self.db_url)
        return self._reader

    def close(self) -> None:
        for gateway in self.gateways:
            gateway.close()
        if self._reader is not None:
            self._reader.close()
        if self.gate is not None:
            self.gate.close()


# -------------------------------------------------------------------------------- payments


@dataclass(frozen=True)
class Answer:
    """One answer the client got: HTTP status (None: no HTTP answer) and error code (or the
    transport error's name)."""

    replica: int
    status: int | None
    code: str | None
    retry_after: float | None = None


@dataclass
class Payment:
    """One signed payment for one request, and everything the client got for it."""

    index: int
    network: str
    body: dict[str, Any]
    header: str
    payer: str
    nonce: str  # the ledger's key: the EIP-3009 nonce, or the Solana message's SHA-256
    amount: int
    transaction_id: str | None = None  # Solana: the fee payer's signature, known before sending
    answers: list[Answer] = field(default_factory=list)
    results: list[bytes] = field(default_factory=list)  # the body of every 200
    transactions: list[str] = field(default_factory=list)  # the receipt's transaction of every 200
    final: Answer | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.payer, self.nonce)

    def told(self, code: str) -> bool:
        return any(a.code == code for a in self.answers)


def cut_by_the_kill(payments: Sequence[Payment], replica: int = 0) -> Payment:
    """The payment whose request gateway `replica` was answering when it was killed: its answer from
    there is a broken connection, not a refused one. Paid one at a time, it is the one that reached
    the failpoint, whichever its index (on a loaded machine an earlier payment whose claim's lease
    ran out is finished elsewhere without reaching it)."""
    cut = [p for p in payments
           if any(a.replica == replica and a.status is None and a.code not in NOT_CUT for a in p.answers)]
    assert len(cut) == 1, f"{len(cut)} requests cut by the kill of gateway {replica}: {cut}"
    return cut[0]


def settled_by_reconciler(deployment: Deployment, payment: Payment) -> bool:
    """Did a reconciler (a pass, or a retry asking it) record this payment's settlement?"""
    row = deployment.row(payment)
    return row is not None and any(
        e["to_state"] == "settled" and str(e["actor"]).startswith("reconciler@")
        for e in deployment.events(row["id"]))


def sign_payments(chains: Chains, url: str, networks: Sequence[str], tag: str) -> list[Payment]:
    """One payment per entry of `networks`, each for a request of its own (a distinct text), by
    one fresh payer per network funded on chain, signed with the x402 SDK's client."""
    _, required = quote(f"{url}{RESOURCE}", {"text": "quote", "model": "gpt-4o"})
    price = {option.network: int(option.amount) for option in required.accepts}
    evm_key = sol_payer = None
    if EVM_NET in networks:
        evm_key = chains.evm.new_payer(2 * price[EVM_NET] * networks.count(EVM_NET))
    if SOL_NET in networks:
        sol_payer = chains.solana.new_payer(2 * price[SOL_NET] * networks.count(SOL_NET))
    client = client_for(url, evm_key=evm_key, sol_key=sol_payer, sol_rpc=chains.solana.rpc_url)
    payments = []
    for index, network in enumerate(networks):
        body = {"text": f"{tag}: payment {index} on {network}, {os.urandom(4).hex()}",
                "model": "gpt-4o"}
        payload = sign(client, required, network)
        inner = payload.payload
        if network == EVM_NET:
            auth = inner["authorization"]
            payer, nonce, tx_id = str(auth["from"]).lower(), str(auth["nonce"]).lower(), None
        else:
            tx = VersionedTransaction.from_bytes(base64.b64decode(inner["transaction"]))
            assert sol_payer is not None
            payer, nonce = str(sol_payer.pubkey()), hashlib.sha256(bytes(tx.message)).hexdigest()
            tx_id = str(chains.solana.fee_payer.sign_message(to_bytes_versioned(tx.message)))
        payments.append(Payment(index, network, body, header(payload), payer, nonce,
                                price[network], tx_id))
    return payments


# --------------------------------------------------------------------------------- the client

# (status, code) a client resends the identical request with the same payment after.
RETRIED = frozenset({(409, "payment_in_progress"), (503, "settlement_pending"),
                     (503, "ledger_unavailable"), (503, "facilitator_unavailable")})
TRANSPORT_BACKOFF_SECONDS = 0.1
NOT_CUT = ("ConnectError", "client_deadline")  # answers without a request in flight


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return error.get("code")
        return body.get("reason")
    return None


def _transaction(response: httpx.Response) -> str:
    return str(json.loads(decode_base64_any(response.headers["PAYMENT-RESPONSE"]))["transaction"])


class ClientRun:
    """Payments being paid in the background; `wait_for` progress, `wait` for the end."""

    def __init__(self, payments: list[Payment], changed: threading.Condition,
                 deadline: float) -> None:
        self.payments, self._changed = payments, changed
        self.deadline = deadline  # time.monotonic() past which a payment's answer is client_deadline
        self.stop = threading.Event()
        self.futures: list[Future[None]] = []
        self.pool: ThreadPoolExecutor | None = None
        self.clients: list[httpx.Client] = []

    def wait_for(self, condition: Callable[[list[Payment]], bool], what: str,
                 timeout: float = 30) -> None:
        """Block until `condition(payments)` holds (checked on every answer), or fail."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self.payments):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout:.0f} s")
                self._changed.wait(left)

    def finished(self) -> bool:
        """Has every payment its final answer?"""
        return all(future.done() for future in self.futures)

    def answer_within(self, seconds: float) -> None:
        """The fault is over: every payment still unanswered gets its final answer within `seconds`
        from now. A deadline counted from the start would also count how long the fault lasted,
        e.g. a killed process's restart (2 s on an idle machine, over 10 s on a loaded one): the
        machine's speed, not the gateway's behaviour."""
        self.deadline = time.monotonic() + seconds

    def wait(self) -> None:
        """Until every payment has its final answer (or the client's deadline passed)."""
        try:
            for future in self.futures:
                future.result()
        finally:
            self.stop.set()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            for client in self.clients:
                client.close()


class Client:
    """Pays each payment's request and resends it, identical, until a final answer: 200 (the
    result), or anything that is neither a transport error nor a `RETRIED` answer. Honours
    Retry-After; each retry goes to the next replica, as a load balancer would send it."""

    def __init__(self, urls: Sequence[str], *, deadline_seconds: float = 30,
                 request_timeout: float = 30) -> None:
        self.urls = list(urls)
        self.deadline_seconds, self.request_timeout = deadline_seconds, request_timeout

    def start(self, payments: list[Payment], *, concurrency: int = 8,
              first: int | None = None, together: threading.Barrier | None = None) -> ClientRun:
        """Pay in the background, `concurrency` at a time; the first attempt of each goes to
        replica `first` (default: spread over the replicas by payment index). `together`: each
        payment's first attempt waits on this barrier (other clients' sends wait on it too), so
        requests sent by several clients reach the gateways at the same moment."""
        changed = threading.Condition()
        run = ClientRun(payments, changed, time.monotonic() + self.deadline_seconds)
        local = threading.local()

        def http() -> httpx.Client:
            if not hasattr(local, "client"):
                local.client = httpx.Client(timeout=self.request_timeout, limits=KEEP_ALIVE)
                run.clients.append(local.client)
            return local.client

        def record(payment: Payment, answer: Answer, final: bool = False) -> None:
            with changed:
                payment.answers.append(answer)
                if final:
                    payment.final = answer
                changed.notify_all()

        def pay(payment: Payment) -> None:
            replica = (payment.index if first is None else first) % len(self.urls)
            if together is not None:
                together.wait(self.deadline_seconds)
            while True:
                if run.stop.is_set() or time.monotonic() > run.deadline:
                    record(payment, Answer(replica, None, "client_deadline"), final=True)
                    return
                try:
                    response = http().post(f"{self.urls[replica]}{RESOURCE}", json=payment.body,
                                           headers={"PAYMENT-SIGNATURE": payment.header})
                except httpx.TransportError as exc:
                    record(payment, Answer(replica, None, type(exc).__name__))
                    replica = (replica + 1) % len(self.urls)
                    run.stop.wait(TRANSPORT_BACKOFF_SECONDS)
                    continue
                code = _code(response)
                retry_after = response.headers.get("Retry-After")
                answer = Answer(replica, response.status_code, code,
                                float(retry_after) if retry_after else None)
                if response.status_code == 200:
                    with changed:
                        payment.results.append(response.content)
                        payment.transactions.append(_transaction(response))
                    record(payment, answer, final=True)
                    return
                if (response.status_code, code) not in RETRIED:
                    record(payment, answer, final=True)
                    return
                record(payment, answer)
                run.stop.wait(min(answer.retry_after or 1.0, max(0.0, run.deadline - time.monotonic())))
                replica = (replica + 1) % len(self.urls)

        run.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="fault-client")
        run.futures = [run.pool.submit(pay, p) for p in payments]
        return run

    def replay(self, payments: list[Payment]) -> None:
        """Send each delivered payment's identical request again, as a client that lost the
        answer would (retrying as usual): it must get the same result, and pay nothing more."""
        delivered = [p for p in payments if p.results]
        if delivered:
            self.start(delivered, concurrency=8).wait()


# --------------------------------------------------------------------------- the invariant


class Violation(AssertionError):
    """Money went wrong: a charge without its result or ledger row, a result without a charge,
    a double charge, a ledger that disagrees with the chain, a balance off by any amount."""


class Unfinished(AssertionError):
    """Payments left claimed, settling or pending past the reconciler's lease (nobody charged)."""


@dataclass
class Report:
    scenario: str
    tried: int
    charged: int
    delivered: int
    released: int
    pending: int  # rows still claimed/settling/pending at the end
    no_row: int
    seconds: float
    answers: Counter[str]
    problems: list[str]
    unfinished: list[str]

    def line(self) -> str:
        seen = ", ".join(f"{k} {v}" for k, v in sorted(self.answers.items()))
        return (f"[faults] {self.scenario}: tried={self.tried} charged={self.charged} "
                f"delivered={self.delivered} released={self.released} pending={self.pending} "
                f"(no row {self.no_row}; {self.seconds:.1f} s; answers: {seen})")


def note(line: str) -> None:
    """Print a line of figures (seen with `-s`) and keep it in test-artifacts/faults.txt
    (tests/support/reports.py; PAYWIRE_TEST_REPORTS=1 prints them at the end of the run)."""
    report("faults", line)
    print("\n" + line, flush=True)


def _answer_name(answer: Answer) -> str:
    if answer.status is None:
        return str(answer.code)
    return f"{answer.status} {answer.code}" if answer.code else str(answer.status)


SETTLE_WITHIN = LEASE_SECONDS + RECONCILE_SECONDS + SLACK_SECONDS


def check(scenario: str, deployment: Deployment, payments: list[Payment],
          before: dict[str, int], *, seconds: float, quiet_since: float | None = None,
          settle_within: float = SETTLE_WITHIN) -> Report:
    """The invariant, for every payment: the chain and the ledger agree; each is charged at most
    once; a charged one has a `settled` row with its transaction and the client got exactly one
    distinct result; an uncharged one is `released` (or has no row) and got no result; no row is
    left unfinished `settle_within` seconds (a lease, a reconciler pass) after the fault ended
    (`quiet_since`, time.monotonic(); default: now); each merchant's balance moved by exactly the
    settled amounts. Prints the counts; raises Violation, then Unfinished."""
    chains = deployment.chains
    keys = {p.key for p in payments}

    def rows() -> dict[tuple[str, str, str], dict[str, Any]]:
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        for row in deployment.rows():
            key = (row["network"], row["payer"], row["nonce"])
            if key in keys:
                assert key not in found, f"two ledger rows for one payment: {key}"
                found[key] = row
        return found

    deadline = (time.monotonic() if quiet_since is None else quiet_since) + settle_within
    ledger = rows()
    while any(str(r["state"]) in UNFINISHED for r in ledger.values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the ledger with a deadline
        ledger = rows()
    after = deployment.merchant_balances()
    landed = chains.solana.statuses([p.transaction_id for p in payments
                                     if p.network == SOL_NET and p.transaction_id])
    problems: list[str] = []
    unfinished: list[str] = []
    charged_sum = Counter[str]()
    settled_sum = Counter[str]()
    counts = Counter[str]()
    for p in payments:
        row = ledger.get(p.key)
        state = str(row["state"]) if row is not None else None
        where = f"payment {p.index} ({p.network}, row {row['id'] if row else None}, {state})"
        if p.network == EVM_NET:
            charged = chains.evm.authorization_used(p.payer, p.nonce)
        else:
            status = landed.get(p.transaction_id or "")
            charged = status is not None and status.get("err") is None
        results = set(p.results)
        counts["charged"] += charged
        counts["delivered"] += bool(p.results)
        counts["released"] += state == "released"
        counts["pending"] += state in UNFINISHED
        counts["no_row"] += row is None
        if len(results) > 1:
            problems.append(f"{where}: {len(results)} distinct answers to one payment: "
                            f"{sorted(r[:200] for r in results)}")
        if row is not None and int(row["amount_atomic"]) != p.amount:
            problems.append(f"{where}: the ledger's amount {row['amount_atomic']} is not {p.amount}")
        if state == "settled":
            settled_sum[p.network] += int(row["amount_atomic"])  # type: ignore[index]
        if charged:
            charged_sum[p.network] += p.amount
            if state != "settled":
                problems.append(f"{where}: charged on chain but the ledger says {state}")
            else:
                tx = str(row["tx_hash"] or "")  # type: ignore[index]
                if p.network == SOL_NET and tx != p.transaction_id:
                    problems.append(f"{where}: ledger transaction {tx} is not the one that landed "
                                    f"({p.transaction_id})")
                if p.network == EVM_NET and not (tx and chains.evm.transaction_ok(tx)):
                    problems.append(f"{where}: ledger transaction {tx!r} is not a successful one")
                wrong = {t for t in p.transactions if t != tx}
                if wrong:
                    problems.append(f"{where}: receipts name {wrong}, the ledger {tx}")
            if not p.results:
                problems.append(f"{where}: charged but the payer never got its result (answers: "
                                f"{[_answer_name(a) for a in p.answers[-5:]]})")
            elif p.final is not None and p.final.status != 200:
                problems.append(f"{where}: delivered, then the same request sent again was "
                                f"answered {_answer_name(p.final)}")
        else:
            if state == "settled":
                problems.append(f"{where}: the ledger says settled but nothing moved on chain")
            if p.results:
                problems.append(f"{where}: a result was delivered but nothing was charged")
            if state in UNFINISHED:
                unfinished.append(f"{where}: still {state} {settle_within:.1f} s after the fault "
                                  f"ended (error: {row.get('error') if row else None}); the "
                                  f"client's last answers: {[_answer_name(a) for a in p.answers[-3:]]}")
    for network in (EVM_NET, SOL_NET):
        moved = after[network] - before[network]
        if not moved == charged_sum[network] == settled_sum[network]:
            problems.append(f"{network}: the merchant's balance moved {moved}; charged payments "
                            f"{charged_sum[network]}; settled rows {settled_sum[network]}")
    answers = Counter(_answer_name(a) for p in payments for a in p.answers)
    report = Report(scenario, len(payments), counts["charged"], counts["delivered"],
                    counts["released"], counts["pending"], counts["no_row"], seconds, answers,
                    problems, unfinished)
    note(report.line())
    if problems:
        raise Violation(f"{scenario}: {len(problems)} problems:\n" + "\n".join(problems[:40]))
    if unfinished:
        raise Unfinished(f"{scenario}: {len(unfinished)} payments unfinished past the lease:\n"
                         + "\n".join(unfinished[:20]))
    return report


@dataclass
class Scenario:
    """A test's run: its payments, the merchant balances before, the clock."""

    name: str
    deployment: Deployment
    payments: list[Payment]
    before: dict[str, int]
    started: float = field(default_factory=time.monotonic)

    quiet_since: float | None = None  # when the fault ended (time.monotonic())

    def quiet(self) -> None:
        """The fault is over (the process is back, the facilitator healed...): from now, every
        row must be finished within a lease and a reconciler pass."""
        self.quiet_since = time.monotonic()

    def check(self, **kwargs: Any) -> Report:
        return check(self.name, self.deployment, self.payments, self.before,
                     seconds=time.monotonic() - self.started, quiet_since=self.quiet_since,
                     **kwargs)


def scenario(name: str, deployment: Deployment, networks: Sequence[str], *,
             via: int = 0) -> Scenario:
    """Sign one payment per entry of `networks` (quoted by gateway `via`), note the balances."""
    payments = sign_payments(deployment.chains, deployment.gateways[via].url, networks, name)
    return Scenario(name, deployment, payments, deployment.merchant_balances())


def mixed(count: int) -> list[str]:
    """`count` networks, EVM and Solana alternating."""
    return [EVM_NET if i % 2 == 0 else SOL_NET for i in range(count)]


def side_by_side(*flows: Callable[[], Any]) -> None:
    """Run independent scenarios at once (deployments with merchants of their own), each in a
    thread; then raise what failed: a Violation or any other error before an Unfinished."""
    errors: list[BaseException] = []

    def guarded(flow: Callable[[], Any]) -> None:
        try:
            flow()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, worst first
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(flow,)) for flow in flows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise sorted(errors, key=lambda e: isinstance(e, Unfinished))[0]


def logged_problems(deployment: Deployment, since: dict[str, int] | None = None,
                    words: Sequence[str] = ("nonce too low", "replacement transaction underpriced",
                                            "Traceback", " ERROR ")) -> list[str]:
    """Log lines of the deployment's gateways (written after `since`, from `log_marks`) that
    contain any of `words`."""
    found = []
    for gateway in deployment.gateways:
        text = gateway.log()[(since or {}).get(gateway.name, 0):]
        found += [f"{gateway.name}: {line}" for line in text.splitlines()
                  if any(w in line for w in words)]
    return found


def log_marks(deployment: Deployment) -> dict[str, int]:
    """Where each gateway's log ends now."""
    return {g.name: len(g.log()) for g in deployment.gateways}
