#!/usr/bin/env python3
"""Paid-call throughput and latency of a real `paywire serve` on its devnet, payments pre-signed.

Per chain, database and concurrency level it starts a fresh `paywire serve` on the devnet
(both chains and the facilitator in that process, a temporary data folder, a free loopback
port; PostgreSQL: one throwaway server from tests/support/postgres.py, a fresh schema per
gateway; --reuse-server keeps one gateway for all levels of a chain), waits for /readyz, tops up
the demo payer with the faucet, asks one 402 quote of the resource, and then:

  1. signs warm-up + --calls distinct payments for that quote with the x402 SDK client, just
     before the level (an EVM authorization is valid maxTimeoutSeconds, 300 s; a Solana
     transaction as long as its blockhash: 15 min on this devnet, 60-90 s on Solana);
  2. sends the warm-up calls (not counted), then the timed calls: C workers over one shared
     aiohttp session, each the identical request with its own `PAYMENT-SIGNATURE`.

A call is ok when it is a 200 carrying a `PAYMENT-RESPONSE` receipt; everything else is counted
by status and error code (a 503 `settlement_pending` apart). Printed per (chain, db, C): calls/s
(ok calls over the timed phase's wall time), latency p50/p90/p99/max of ok calls, the CPU per
call of the server process, of this client and of PostgreSQL, how busy the box was (and with
what else: "others"), and the mean of every
`Server-Timing` stage the server reports, over all ok calls and over the slowest 1%
("outside" = client latency - the server's `total`: queueing before the server's clock starts,
the client's own work, the socket hops).

  .venv/bin/python bench/paid_load.py                        # both chains, SQLite, C=1,8,32
  .venv/bin/python bench/paid_load.py --chain solana --db both --concurrency 32 --calls 2000
  .venv/bin/python bench/paid_load.py --json /tmp/paid-load.json

Client and server share the machine's cores: the client's CPU per call is printed so its
share can be taken into account; discard levels where "others" (other jobs) was high.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
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
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.postgres; nothing of paywire's own is imported

KEYS_FILE = "devnet-keys.json"  # payments/devnet/keys.py: the demo payer's keys, in the data dir

READY_DEADLINE_S = 120.0  # the devnet builds both chains at startup
EVM_VALIDITY_MARGIN_S = 6  # the SDK facilitator refuses an authorization this close to validBefore
DEFAULT_BODY = {"text": "How many tokens is this?", "model": "gpt-4o"}
DEFAULT_CALLS = {"evm": 300, "solana": 2000}  # ~1 min per chain on this 2-core box
FAUCET_MAX_ATOMIC = 1_000_000_000  # /devnet/faucet's limit per call
TAIL_FRACTION = 0.01  # the slowest 1% of ok calls, at least TAIL_MIN calls
TAIL_MIN = 5
CLK_TCK = os.sysconf("SC_CLK_TCK")


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

    def payer_key(self, chain: str) -> str:
        """The devnet demo payer's secret key (EVM hex or Solana base58), written by serve."""
        keys = json.loads((self.data_dir / KEYS_FILE).read_text())
        return str(keys["evm_payer" if chain == "evm" else "sol_payer"])


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


def get_quote(url: str, body: bytes, chain: str) -> Quote:
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
    chosen = [a for a in required.accepts if str(a.network).startswith(prefix) and a.scheme == "exact"]
    if not chosen:
        raise SystemExit(f"no exact {chain} option in the quote: {[a.network for a in required.accepts]}")
    option = chosen[0]
    return Quote(required.model_copy(update={"accepts": [option]}), str(option.network),
                 int(option.amount), int(option.max_timeout_seconds or 0))


def fund_payer(gw: Gateway, address: str, quote: Quote, payments: int) -> int:
    """Top the payer up with the faucet to cover `payments` calls (+5%); returns its balance."""
    need = math.ceil(quote.amount * payments * 1.05)
    query = urllib.parse.urlencode({"network": quote.network, "address": address})
    _, answer = http_json("GET", f"{gw.base}/devnet/balance?{query}")
    balance = int(answer["balance"])
    while balance < need:
        amount = min(FAUCET_MAX_ATOMIC, need - balance)
        status, answer = http_json("POST", f"{gw.base}/devnet/faucet",
                                   {"network": quote.network, "address": address, "amount": amount})
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


def sign_payments(client: Any, quote: Quote, n: int) -> list[str]:
    """`n` distinct signed payments for the quote, as PAYMENT-SIGNATURE header values."""
    headers = []
    for _ in range(n):
        payload = client.create_payment_payload(quote.required)
        data = payload.model_dump(by_alias=True, exclude_none=True)
        headers.append(base64.b64encode(json.dumps(data, separators=(",", ":")).encode()).decode())
    if len(set(headers)) != n:
        raise SystemExit("the SDK signed identical payments; they would be refused as replays")
    return headers


# ---------------------------------------------------------------------- the timed phase


@dataclass
class Call:
    ms: float  # client latency: request sent to body read
    status: int
    kind: str  # "ok", "settlement_pending", or "<status> <code>"
    timing: dict[str, float]


def parse_server_timing(header: str) -> dict[str, float]:
    """`name;dur=1.2;desc="..."` entries; a stage without dur counts as 0."""
    stages: dict[str, float] = {}
    for entry in header.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        if not name:
            continue
        dur = 0.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    dur = float(value.strip().strip('"'))
        stages[name] = stages.get(name, 0.0) + dur
    return stages


def error_code(raw: bytes) -> str:
    """The error code of an error answer, whatever shape it has ("" when none)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("code") or err.get("type") or "")
    if isinstance(err, str):
        return err
    return str(data.get("code") or "")


def classify(status: int, headers: Any, raw: bytes) -> str:
    if status == 200:
        return "ok" if headers.get("PAYMENT-RESPONSE") else "200 no_receipt"
    code = error_code(raw)
    if code == "settlement_pending":
        return "settlement_pending"
    return f"{status} {code}".strip()


async def one_call(session: aiohttp.ClientSession, url: str, body: bytes, payment: str) -> Call:
    headers = {"Content-Type": "application/json", "PAYMENT-SIGNATURE": payment}
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as r:
            raw = await r.read()
            ms = (time.perf_counter() - t0) * 1000
            return Call(ms, r.status, classify(r.status, r.headers, raw),
                        parse_server_timing(r.headers.get("Server-Timing", "")))
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Call((time.perf_counter() - t0) * 1000, 0, f"client {type(exc).__name__}", {})


async def run_calls(session: aiohttp.ClientSession, url: str, body: bytes, payments: list[str],
                    concurrency: int) -> list[Call]:
    """`concurrency` workers take payments from one shared iterator until none are left."""
    pending: Iterator[str] = iter(payments)
    calls: list[Call] = []

    async def worker() -> None:
        for payment in pending:  # shared: each payment is taken by exactly one worker
            calls.append(await one_call(session, url, body, payment))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return calls


# ---------------------------------------------------------------------- CPU accounting


def _stat(pid: int) -> list[str]:
    """Fields 3.. of /proc/PID/stat (after the command name); [] when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def proc_cpu(pid: int, reaped_children: bool = False) -> float:
    """CPU seconds of a process (all threads): utime + stime, and its reaped children's."""
    f = _stat(pid)
    if not f:
        return 0.0
    ticks = int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if reaped_children else 0)
    return ticks / CLK_TCK


def postgres_cpu(data_dir: Path) -> float:
    """CPU seconds of a PostgreSQL server: the postmaster, its live and its exited backends."""
    try:
        master = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = proc_cpu(master, reaped_children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            f = _stat(int(entry.name))
            if f and int(f[1]) == master:  # field 4: ppid
                total += proc_cpu(int(entry.name))
    return total


@dataclass
class CpuSnapshot:
    """CPU seconds so far: the server, this client, the database server, the whole box."""

    wall: float
    server: float
    client: float
    db: float
    box_busy: float

    @staticmethod
    def take(server_pid: int, pg_data_dir: Path | None) -> CpuSnapshot:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return CpuSnapshot(time.perf_counter(), proc_cpu(server_pid), time.process_time(),
                           postgres_cpu(pg_data_dir) if pg_data_dir else 0.0,
                           (sum(values) - idle) / CLK_TCK)


# ---------------------------------------------------------------------- figures


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (nan when empty)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def stage_means(calls: list[Call]) -> dict[str, float]:
    """Mean ms per stage over the calls (a stage a call did not report counts 0 for it), in the
    order the server reports them, plus `outside` = client latency - server total."""
    names: dict[str, None] = {}
    for c in calls:
        names.update(dict.fromkeys(c.timing))
    if not calls:
        return {}
    means = {n: sum(c.timing.get(n, 0.0) for c in calls) / len(calls) for n in names}
    if "total" in names:
        means["outside"] = sum(c.ms - c.timing.get("total", 0.0) for c in calls) / len(calls)
    return means


@dataclass
class Level:
    chain: str
    db: str
    concurrency: int
    calls: int
    ok: int
    outcomes: dict[str, int]
    elapsed_s: float
    calls_per_s: float
    latency_ms: dict[str, float]
    stages_mean_ms: dict[str, float]
    tail_stages_mean_ms: dict[str, float]
    tail_calls: int
    server_cpu_ms_per_call: float
    client_cpu_ms_per_call: float
    db_cpu_ms_per_call: float  # PostgreSQL's processes; 0 on SQLite (it runs in the server)
    box_busy_pct: float  # of all cores
    others_busy_pct: float  # of all cores: busy but none of the above (other jobs on the box)
    sign_s: float
    valid_for_s: float
    samples: list[dict[str, Any]] = field(repr=False, default_factory=list)


def summarize(chain: str, db: str, c: int, calls: list[Call], cpu0: CpuSnapshot,
              cpu1: CpuSnapshot, sign_s: float, valid_for_s: float) -> Level:
    elapsed = cpu1.wall - cpu0.wall
    server, client = cpu1.server - cpu0.server, cpu1.client - cpu0.client
    dbase, busy = cpu1.db - cpu0.db, cpu1.box_busy - cpu0.box_busy
    capacity = elapsed * (os.cpu_count() or 1) / 100  # CPU seconds per percent of the box
    ok = [x for x in calls if x.kind == "ok"]
    lat = sorted(x.ms for x in ok)
    tail_n = min(len(ok), max(TAIL_MIN, math.ceil(len(ok) * TAIL_FRACTION)))
    tail = sorted(ok, key=lambda x: x.ms)[len(ok) - tail_n:]
    n = max(1, len(calls))
    return Level(
        chain, db, c, len(calls), len(ok), dict(Counter(x.kind for x in calls)), elapsed,
        len(ok) / elapsed if elapsed > 0 else math.nan,
        {"p50": percentile(lat, 0.5), "p90": percentile(lat, 0.9), "p99": percentile(lat, 0.99),
         "max": lat[-1] if lat else math.nan,
         "mean": sum(lat) / len(lat) if lat else math.nan},
        stage_means(ok), stage_means(tail), tail_n,
        server / n * 1000, client / n * 1000, dbase / n * 1000, busy / capacity,
        max(0.0, busy - server - client - dbase) / capacity, sign_s, valid_for_s,
        [{"ms": round(x.ms, 3), "status": x.status, "kind": x.kind, "timing": x.timing}
         for x in calls],
    )


# ---------------------------------------------------------------------- one gateway, all levels


async def run_levels(gw: Gateway, chain: str, db: str, levels: list[int], n_calls: int,
                     warmup: int, url: str, body: bytes, quote: Quote,
                     pg_data_dir: Path | None) -> list[Level]:
    signer = make_signer(gw, chain)
    if chain == "evm":
        valid_for = quote.max_timeout_s - EVM_VALIDITY_MARGIN_S
    else:
        valid_for = await asyncio.to_thread(solana_blockhash_life_s, gw)
    results = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for c in levels:
            n_warm = max(warmup, c)  # opens every worker's connection before the clock starts
            t_sign = time.perf_counter()
            payments = await asyncio.to_thread(sign_payments, signer, quote, n_warm + n_calls)
            sign_s = time.perf_counter() - t_sign
            warm = await run_calls(session, url, body, payments[:n_warm], c)
            bad = Counter(x.kind for x in warm if x.kind != "ok")
            if bad:
                print(f"  warm-up {chain}/{db}/C={c}: {dict(bad)}", file=sys.stderr)
            cpu0 = CpuSnapshot.take(gw.proc.pid, pg_data_dir)
            calls = await run_calls(session, url, body, payments[n_warm:], c)
            cpu1 = CpuSnapshot.take(gw.proc.pid, pg_data_dir)
            if time.perf_counter() - t_sign - sign_s > valid_for:
                print(f"  warning: {chain}/C={c} ran past the payments' validity ({valid_for:.0f} s "
                      "after signing): lower --calls", file=sys.stderr)
            level = summarize(chain, db, c, calls, cpu0, cpu1, sign_s, valid_for)
            print(f"  {chain}/{db} C={c}: {level.ok}/{level.calls} ok, "
                  f"{level.calls_per_s:.1f} calls/s, p99 {level.latency_ms['p99']:.0f} ms "
                  f"(signed {n_warm + n_calls} in {sign_s:.1f} s)", file=sys.stderr)
            results.append(level)
    return results


def run_chain(chain: str, db: str, pg: Any, levels: list[int], args: argparse.Namespace,
              extra_env: dict[str, str]) -> list[Level]:
    """The `levels` of one chain on one fresh gateway (on PostgreSQL a fresh schema too)."""
    database_url = pg.fresh_url() if pg is not None else None  # a role and schema of its own
    gw = start_gateway(args.source, database_url, extra_env)
    try:
        url = f"{gw.base}/v1/marketplace/api/{args.skill}"
        body = json.dumps(args.body, separators=(",", ":")).encode()
        quote = get_quote(url, body, chain)
        n_calls = args.calls or DEFAULT_CALLS[chain]
        total = sum(max(args.warmup, c) + n_calls for c in levels)
        payer = payer_address(gw, chain)
        balance = fund_payer(gw, payer, quote, total)
        print(f"{chain}/{db}: {gw.base}, {quote.amount} atomic units per call, payer holds "
              f"{balance / 1e6:.2f} USDC for {total} payments", file=sys.stderr)
        loop = _loop_factory()
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(run_levels(gw, chain, db, levels, n_calls, args.warmup,
                                         url, body, quote, pg.data_dir if pg else None))
    except BaseException:
        tail = gw.log_tail()
        if tail.strip():
            print(f"paywire serve log (tail):\n{tail}", file=sys.stderr)
        raise
    finally:
        stop_gateway(gw)


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# ---------------------------------------------------------------------- output


def print_tables(levels: list[Level]) -> None:
    head = (f"{'chain':7} {'db':10} {'C':>3} {'calls':>6} {'ok':>6} {'calls/s':>8} {'p50':>7} "
            f"{'p90':>7} {'p99':>7} {'max':>7} {'srv cpu':>8} {'cli cpu':>8} {'db cpu':>7} "
            f"{'box':>5} {'others':>6}  errors")
    print("\npaid calls (latency of ok calls in ms; CPU in ms per call: the server process, this "
          "client, PostgreSQL; box: busy % of all cores, others: of which none of these)")
    print(head)
    for lv in levels:
        lat = lv.latency_ms
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(lv.outcomes.items()) if k != "ok") or "-"
        print(f"{lv.chain:7} {lv.db:10} {lv.concurrency:>3} {lv.calls:>6} {lv.ok:>6} "
              f"{lv.calls_per_s:>8.1f} {lat['p50']:>7.1f} {lat['p90']:>7.1f} {lat['p99']:>7.1f} "
              f"{lat['max']:>7.1f} {lv.server_cpu_ms_per_call:>8.2f} "
              f"{lv.client_cpu_ms_per_call:>8.2f} {lv.db_cpu_ms_per_call:>7.2f} "
              f"{lv.box_busy_pct:>4.0f}% {lv.others_busy_pct:>5.0f}%  {errors}")
    names: dict[str, None] = {}
    for lv in levels:
        names.update(dict.fromkeys(k for k in lv.stages_mean_ms if k not in ("total", "outside")))
    cols = [*names, "total", "outside", "latency"]
    print("\nServer-Timing stage means in ms (all: every ok call; tail: the slowest 1% of ok calls, "
          f"at least {TAIL_MIN}; outside = latency - total)")
    print(f"{'chain':7} {'db':10} {'C':>3} {'':4} " + " ".join(f"{n:>8}" for n in cols))
    for lv in levels:
        for label, means, lat in (("all", lv.stages_mean_ms, lv.latency_ms["mean"]),
                                  ("tail", lv.tail_stages_mean_ms, _tail_latency(lv))):
            row = {**means, "latency": lat}
            cells = " ".join(f"{row[n]:>8.2f}" if n in row else f"{'-':>8}" for n in cols)
            print(f"{lv.chain:7} {lv.db:10} {lv.concurrency:>3} {label:4} {cells}")


def _tail_latency(lv: Level) -> float:
    ok = sorted(s["ms"] for s in lv.samples if s["kind"] == "ok")
    tail = ok[len(ok) - lv.tail_calls:] if lv.tail_calls else []
    return sum(tail) / len(tail) if tail else math.nan


# ---------------------------------------------------------------------- main


def _no_nan(value: Any) -> Any:
    """NaN (a figure with no calls behind it) as null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def body_for(skill: str) -> Any:
    """The first example of a builtin resource file, else the token-count example."""
    path = ROOT / "skills" / "builtin" / f"{skill}.json"
    if path.exists():
        examples = json.loads(path.read_text()).get("examples") or []
        if examples:
            return examples[0]
    return DEFAULT_BODY


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", choices=["evm", "solana", "both"], default="both")
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    ap.add_argument("--calls", type=int, default=0,
                    help=f"timed calls per level (default: {DEFAULT_CALLS})")
    ap.add_argument("--warmup", type=int, default=5,
                    help="uncounted calls before each level (at least C)")
    ap.add_argument("--skill", default="token-count-508", help="a fixed-price marketplace resource")
    ap.add_argument("--body", type=json.loads, default=None,
                    help="the JSON request body (default: the resource file's first example)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for paywire serve (repeatable)")
    ap.add_argument("--reuse-server", action="store_true",
                    help="run all levels of a chain on one server (default: a fresh one per level)")
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the tree to serve (default this one; e.g. a `git archive` export of a "
                         "commit, to measure it while the working tree changes)")
    ap.add_argument("--json", type=Path, help="write the raw figures (every call) here")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.body is None:
        args.body = body_for(args.skill)
    extra_env = dict(e.split("=", 1) for e in args.env)
    chains = ["evm", "solana"] if args.chain == "both" else [args.chain]
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]

    pg = None
    levels: list[Level] = []
    started = time.time()
    try:
        for db in dbs:
            if db == "postgresql" and pg is None:
                from tests.support.postgres import start_postgres

                pg = start_postgres()
            for chain in chains:
                # A fresh server per level by default: every level starts from the same state
                # (new chains, empty ledger), so levels compare and their order does not matter.
                groups = [args.concurrency] if args.reuse_server else [[c] for c in args.concurrency]
                for group in groups:
                    levels += run_chain(chain, db, pg if db == "postgresql" else None, group, args,
                                        extra_env)
    finally:
        if pg is not None:
            from tests.support.postgres import stop_postgres

            stop_postgres(pg)
    print_tables(levels)
    if args.json:
        meta = {"started": started, "cpus": os.cpu_count(), "skill": args.skill, "body": args.body,
                "concurrency": args.concurrency, "warmup": args.warmup,
                "python": sys.version.split()[0], "source": str(args.source),
                "reuse_server": args.reuse_server}
        doc = _no_nan({"meta": meta, "levels": [asdict(lv) for lv in levels]})
        args.json.write_text(json.dumps(doc, indent=1, allow_nan=False))
        print(f"\nraw figures: {args.json}")


if __name__ == "__main__":
    main()
