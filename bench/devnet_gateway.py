"""A `paywire serve` on its devnet for the benches: started on a free loopback port, its quote,
its faucet, its demo payer's keys and the x402 SDK's exact clients for them.

Nothing of paywire's own is imported: the gateway is reached over HTTP only, like any client.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEYS_FILE = "devnet-keys.json"  # payments/devnet/keys.py: the demo payer's keys, in the data dir
READY_DEADLINE_S = 120.0  # the devnet builds both chains at startup
FAUCET_MAX_ATOMIC = 1_000_000_000  # /devnet/faucet's limit per call
OPTION_OF = {"exact": "exact", "upto": "upto", "channel": "batch-settlement"}  # scheme -> x402's


# ---------------------------------------------------------------------- server processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    """A small blocking JSON request (setup only, never in the timed phase)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


@dataclass
class Gateway:
    """One `paywire serve` process on the devnet, with its data folder and log."""

    proc: subprocess.Popen[bytes]
    base: str
    data_dir: Path
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def keys(self) -> dict[str, str]:
        """The devnet's keys file, written by serve (the demo payer's, the minter's...)."""
        return dict(json.loads((self.data_dir / KEYS_FILE).read_text()))

    def payer_key(self, chain: str) -> str:
        """The devnet demo payer's secret key (EVM hex or Solana base58)."""
        return str(self.keys()["evm_payer" if chain == "evm" else "sol_payer"])


def start_gateway(source: Path, database_url: str | None, extra_env: dict[str, str]) -> Gateway:
    """`paywire serve` from the tree `source` on the devnet, on a free loopback port, ready."""
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="paywire-paid-load-"))
    # No inherited PAYWIRE_* (real networks, a facilitator URL, a database) takes it off the devnet.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYWIRE_")}
    env |= {"PAYWIRE_HOST": "127.0.0.1", "PAYWIRE_PORT": str(port),
            "PAYWIRE_DATA_DIR": str(data_dir), **extra_env}
    if database_url:
        env["PAYWIRE_DATABASE_URL"] = database_url
    log_path = data_dir / "serve.log"
    with open(log_path, "wb") as log:
        # `python -m agent.cli.main` is the `paywire` script; run in `source`, it imports that tree.
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli.main", "serve", "--log-level", "warning"],
                                cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
    gw = Gateway(proc, f"http://127.0.0.1:{port}", data_dir, log_path)
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        if proc.poll() is not None:
            tail = gw.log_tail()
            stop_gateway(gw)
            raise SystemExit(f"paywire serve exited with status {proc.returncode}:\n{tail}")
        try:
            status, _ = http_json("GET", f"{gw.base}/readyz", timeout=2)
            if status == 200:
                return gw
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            tail = gw.log_tail()
            stop_gateway(gw)
            raise SystemExit(f"paywire serve not ready within {READY_DEADLINE_S:.0f} s:\n{tail}")
        time.sleep(0.1)  # poll interval


def stop_gateway(gw: Gateway) -> None:
    gw.proc.terminate()
    try:
        gw.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        gw.proc.kill()
        gw.proc.wait()
    shutil.rmtree(gw.data_dir, ignore_errors=True)


# ---------------------------------------------------------------------- quote, funding, signing


@dataclass
class Quote:
    required: Any  # x402 PaymentRequired (v2) with only the chosen option
    network: str  # CAIP-2
    amount: int  # atomic units per call
    max_timeout_s: int
    extra: dict[str, Any]  # the option's extra (a channel's minDeposit, receiverAuthorizer...)


def get_quote(url: str, body: bytes, chain: str, scheme: str = "exact") -> Quote:
    from x402.schemas import PaymentRequired

    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raise SystemExit(f"{url} answered {r.status} without payment: not a paid resource?")
    except urllib.error.HTTPError as exc:
        if exc.code != 402:
            raise SystemExit(f"{url} answered {exc.code}: {exc.read()[:300]!r}") from None
        header = exc.headers.get("PAYMENT-REQUIRED")
    if not header:
        raise SystemExit("the 402 has no PAYMENT-REQUIRED header (x402 v2)")
    required = PaymentRequired.model_validate(json.loads(base64.b64decode(header)))
    prefix = "eip155:" if chain == "evm" else "solana:"
    wanted = OPTION_OF[scheme]
    chosen = [a for a in required.accepts if str(a.network).startswith(prefix) and a.scheme == wanted]
    if not chosen:
        offered = [(a.scheme, str(a.network)) for a in required.accepts]
        raise SystemExit(f"no {wanted} {chain} option in the quote: {offered}")
    option = chosen[0]
    return Quote(required.model_copy(update={"accepts": [option]}), str(option.network),
                 int(option.amount), int(option.max_timeout_seconds or 0), dict(option.extra or {}))


def fund_payer(gw: Gateway, address: str, quote: Quote, payments: int) -> int:
    """Top the payer up with the faucet to cover `payments` calls (+5%); returns its balance."""
    return fund_address(gw, quote.network, address, math.ceil(quote.amount * payments * 1.05))


def fund_address(gw: Gateway, network: str, address: str, need: int) -> int:
    """Top `address` up to `need` atomic units with the faucet; returns its balance."""
    query = urllib.parse.urlencode({"network": network, "address": address})
    _, answer = http_json("GET", f"{gw.base}/devnet/balance?{query}")
    balance = int(answer["balance"])
    while balance < need:
        amount = min(FAUCET_MAX_ATOMIC, need - balance)
        status, answer = http_json("POST", f"{gw.base}/devnet/faucet",
                                   {"network": network, "address": address, "amount": amount})
        if status != 200:
            raise SystemExit(f"the faucet refused: {status} {answer}")
        balance += amount
    return balance


def solana_blockhash_life_s(gw: Gateway) -> float:
    """How long a fresh blockhash stays valid on this devnet (lastValidBlockHeight - slot)."""
    _, answer = http_json("POST", f"{gw.base}/devnet/solana",
                          {"jsonrpc": "2.0", "id": 1, "method": "getLatestBlockhash", "params": []})
    result = answer["result"]
    return (result["value"]["lastValidBlockHeight"] - result["context"]["slot"]) * 0.4


def make_signer(gw: Gateway, chain: str) -> Any:
    """The x402 SDK's sync client for the demo payer on one chain."""
    from x402 import x402ClientSync

    client = x402ClientSync()
    client.set_spend_controls(False)
    if chain == "evm":
        from eth_account import Account
        from x402.mechanisms.evm.exact import register_exact_evm_client
        from x402.mechanisms.evm.signers import EthAccountSigner

        register_exact_evm_client(client, EthAccountSigner(Account.from_key(gw.payer_key(chain))))
    else:
        # The SDK's sync client uses solana-py's deprecated sync Client: fine for signing here.
        warnings.filterwarnings("ignore", message="Client is deprecated", category=FutureWarning)
        from x402.mechanisms.svm.exact import register_exact_svm_client
        from x402.mechanisms.svm.signers import KeypairSigner

        # Each signature asks this RPC for a recent blockhash (a memo nonce makes each distinct).
        register_exact_svm_client(client, KeypairSigner.from_base58(gw.payer_key(chain)),
                                  rpc_url=f"{gw.base}/devnet/solana")
    return client


def payer_address(gw: Gateway, chain: str) -> str:
    if chain == "evm":
        from eth_account import Account

        return str(Account.from_key(gw.payer_key(chain)).address)
    from solders.keypair import Keypair

    return str(Keypair.from_base58_string(gw.payer_key(chain)).pubkey())
