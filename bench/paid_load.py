#!/usr/bin/env python3
"""Paid-call throughput and latency of a real `paywire serve` on its devnet, per payment scheme.

Per scheme, chain, database and concurrency level it starts a fresh `paywire serve` on the devnet
(both chains and the facilitator in that process, a temporary data folder, a free loopback
port; PostgreSQL: one throwaway server from tests/support/postgres.py, a fresh schema per
gateway; --reuse-server keeps one gateway for all levels of a chain), waits for /readyz, asks one
402 quote, picks the scheme's option, and then:

  1. prepares the payments with the x402 SDK's own clients, just before the level:
     - exact: warm-up + --calls distinct payments signed ahead by the demo payer (an EVM
       authorization is valid maxTimeoutSeconds, 300 s; a Solana transaction as long as its
       blockhash: 15 min on this devnet, 60-90 s on Solana);
     - upto (EVM, a route priced from its request: --route chat): the demo payer approves Permit2
       once (its own transaction), then Permit2 authorizations of the quote's maximum, signed
       ahead; each call settles what it used;
     - channel (batch-settlement, EVM): C payers, one channel each (a channel serves one call at
       a time), each paying one deposit before the clock starts; then vouchers, signed ahead
       where the route's charge is fixed (the resource route), else each one on the previous
       receipt's running total (--vouchers live; the chat route), by the SDK client's hook;
     - free: the same route and body served free (PAYWIRE_FREE_MODELS; --route chat), the
       baseline a paid call is compared with;
  2. sends the warm-up calls (not counted), then the timed calls: C workers over one shared
     aiohttp session, each the identical request with its own `PAYMENT-SIGNATURE`.

--route chat serves the chat model (--model, default gpt-4o: priced per request from its token
prices) from ../shared/bench/mock_upstream.py on loopback, which reports a fixed usage (9 prompt,
12 completion tokens): upto and channel calls are charged that, exact calls their quote.

A paid call is ok when it is a 200 carrying a `PAYMENT-RESPONSE` receipt (a free one: a 200);
everything else is counted by status and error code (a 503 `settlement_pending` apart). Printed
per level: calls/s (ok calls over the timed phase's wall time), latency p50/p90/p99/max of ok
calls, the CPU per call of the server process, of this client (live vouchers: their signing
too), of the mock upstream and of PostgreSQL, how busy the box was (and with what else:
"others"); the mean of every `Server-Timing` stage the server reports, over all ok calls and over
the slowest 1% ("outside" = client latency - the server's `total`: queueing before the server's
clock starts, the client's own work, the socket hops); and what the calls cost: the quote, what
the payer paid per call, the gas per call from the transactions' receipts (channels: the
deposits', with claims amortized, chain_gas.py).

  .venv/bin/python bench/paid_load.py                        # exact, both chains, SQLite, C=1,8,32
  .venv/bin/python bench/paid_load.py --chain solana --db both --concurrency 32 --calls 2000
  .venv/bin/python bench/paid_load.py --scheme channel,free --route chat --concurrency 10,32
  .venv/bin/python bench/paid_load.py --scheme exact,upto --chain evm --route chat --calls 200
  .venv/bin/python bench/paid_load.py --json /tmp/paid-load.json

Client and server share the machine's cores: the client's CPU per call is printed so its
share can be taken into account; discard levels where "others" (other jobs) was high.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.postgres; nothing of paywire's own is imported

# bench/ (this script's folder, first on sys.path): its own modules
import spy_profile  # noqa: E402
from devnet_gateway import Gateway, Quote, free_port, get_quote, start_gateway, stop_gateway  # noqa: E402
from paid_supply import FEE_METER_INTERVAL_S, Supply, costs, prepare  # noqa: E402
from payment_lanes import RECEIPT_HEADER, Lane  # noqa: E402

DEFAULT_BODY = {"text": "How many tokens is this?", "model": "gpt-4o"}
CHAT_PROMPT = "Say hello in one word."  # the example: a 4,096-token cap quoted, 12 used
SCHEMES = ("exact", "upto", "channel", "free")
EVM_ONLY = ("upto", "channel")  # the SDK has neither on Solana
# ~1 min per level on this 2-core box: EVM settlements are bound by the chain (py-evm)
DEFAULT_CALLS = {("exact", "evm"): 300, ("exact", "solana"): 2000, ("upto", "evm"): 300,
                 ("channel", "evm"): 6000, ("free", "none"): 6000}
MOCK_UPSTREAM = ROOT.parent / "shared" / "bench" / "mock_upstream.py"
TAIL_FRACTION = 0.01  # the slowest 1% of ok calls, at least TAIL_MIN calls
TAIL_MIN = 5
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- the timed phase


@dataclass
class Call:
    ms: float  # client latency: request sent to body read
    status: int
    kind: str  # "ok", "settlement_pending", or "<status> <code>"
    timing: dict[str, float]
    receipt: str = ""  # the PAYMENT-RESPONSE header, decoded after the timed phase


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


def classify(status: int, headers: Any, raw: bytes, paid: bool) -> str:
    if status == 200:
        return "ok" if headers.get(RECEIPT_HEADER) or not paid else "200 no_receipt"
    code = error_code(raw)
    if code == "settlement_pending":
        return "settlement_pending"
    return f"{status} {code}".strip()


async def one_call(session: aiohttp.ClientSession, url: str, body: bytes, payment: str,
                   lane: Lane) -> Call:
    headers = {"Content-Type": "application/json"}
    if payment:
        headers["PAYMENT-SIGNATURE"] = payment
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as r:
            raw = await r.read()
            ms = (time.perf_counter() - t0) * 1000
            lane.answered(r.status, r.headers)
            return Call(ms, r.status, classify(r.status, r.headers, raw, bool(payment)),
                        parse_server_timing(r.headers.get("Server-Timing", "")),
                        r.headers.get(RECEIPT_HEADER, ""))
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Call((time.perf_counter() - t0) * 1000, 0, f"client {type(exc).__name__}", {})


async def run_calls(session: aiohttp.ClientSession, url: str, body: bytes,
                    lanes: list[Lane]) -> list[Call]:
    """One worker per lane, each sending its lane's payments until the lane is done (lanes may
    share one supply: then each payment is taken by exactly one worker)."""
    calls: list[Call] = []

    async def worker(lane: Lane) -> None:
        while (payment := lane.next_payment()) is not None:
            calls.append(await one_call(session, url, body, payment, lane))

    await asyncio.gather(*(worker(lane) for lane in lanes))
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


def proc_sys_cpu(pid: int) -> float:
    """The kernel's part of a process's CPU seconds (stime: sockets, file writes)."""
    f = _stat(pid)
    return int(f[12]) / CLK_TCK if f else 0.0


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
    """CPU seconds so far: the server, this client, the database server, the mock upstream,
    the whole box."""

    wall: float
    server: float
    server_sys: float
    client: float
    db: float
    upstream: float
    box_busy: float

    @staticmethod
    def take(server_pid: int, pg_data_dir: Path | None, upstream_pid: int | None) -> CpuSnapshot:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return CpuSnapshot(time.perf_counter(), proc_cpu(server_pid), proc_sys_cpu(server_pid),
                           time.process_time(),
                           postgres_cpu(pg_data_dir) if pg_data_dir else 0.0,
                           proc_cpu(upstream_pid) if upstream_pid else 0.0,
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
class Plan:
    """What one gateway measures: a scheme on a chain and database, over one route."""

    scheme: str
    chain: str  # "evm", "solana"; "none" for free calls
    db: str
    route: str  # "resource" (a fixed-price marketplace resource) or "chat" (a chat model)
    presign_vouchers: bool  # channel: vouchers signed ahead (the route's charge is fixed)


@dataclass
class Level:
    scheme: str
    route: str
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
    server_sys_ms_per_call: float  # of which in the kernel
    client_cpu_ms_per_call: float
    db_cpu_ms_per_call: float  # PostgreSQL's processes; 0 on SQLite (it runs in the server)
    upstream_cpu_ms_per_call: float  # the mock upstream (chat route)
    box_busy_pct: float  # of all cores
    others_busy_pct: float  # of all cores: busy but none of the above (other jobs on the box)
    sign_s: float
    valid_for_s: float
    vouchers: str = ""  # channel: "presigned" or "live"
    costs: dict[str, Any] = field(default_factory=dict)  # paid_supply.costs
    samples: list[dict[str, Any]] = field(repr=False, default_factory=list)


def summarize(plan: Plan, c: int, calls: list[Call], cpu0: CpuSnapshot, cpu1: CpuSnapshot,
              sign_s: float, supply: Supply) -> Level:
    elapsed = cpu1.wall - cpu0.wall
    server, client = cpu1.server - cpu0.server, cpu1.client - cpu0.client
    dbase, busy = cpu1.db - cpu0.db, cpu1.box_busy - cpu0.box_busy
    upstream = cpu1.upstream - cpu0.upstream
    capacity = elapsed * (os.cpu_count() or 1) / 100  # CPU seconds per percent of the box
    ok = [x for x in calls if x.kind == "ok"]
    lat = sorted(x.ms for x in ok)
    tail_n = min(len(ok), max(TAIL_MIN, math.ceil(len(ok) * TAIL_FRACTION)))
    tail = sorted(ok, key=lambda x: x.ms)[len(ok) - tail_n:]
    n = max(1, len(calls))
    return Level(
        plan.scheme, plan.route, plan.chain, plan.db, c, len(calls), len(ok),
        dict(Counter(x.kind for x in calls)), elapsed,
        len(ok) / elapsed if elapsed > 0 else math.nan,
        {"p50": percentile(lat, 0.5), "p90": percentile(lat, 0.9), "p99": percentile(lat, 0.99),
         "max": lat[-1] if lat else math.nan,
         "mean": sum(lat) / len(lat) if lat else math.nan},
        stage_means(ok), stage_means(tail), tail_n,
        server / n * 1000, (cpu1.server_sys - cpu0.server_sys) / n * 1000, client / n * 1000,
        dbase / n * 1000, upstream / n * 1000,
        busy / capacity, max(0.0, busy - server - client - dbase - upstream) / capacity,
        sign_s, supply.valid_for_s,
        ("presigned" if supply.presigned else "live") if plan.scheme == "channel" else "",
        samples=[{"ms": round(x.ms, 3), "status": x.status, "kind": x.kind, "timing": x.timing}
                 for x in calls],
    )


# ---------------------------------------------------------------------- one gateway, all levels


async def run_levels(gw: Gateway, plan: Plan, levels: list[int], n_calls: int, warmup: int,
                     url: str, body: bytes, quote: Quote | None, pg_data_dir: Path | None,
                     upstream_pid: int | None, spy_dir: Path | None) -> list[Level]:
    results = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    label = f"{plan.scheme}/{plan.chain}/{plan.db}"
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for c in levels:
            n_warm = max(warmup, c)  # opens every worker's connection before the clock starts
            supply = await prepare(plan.scheme, gw, plan.chain, session, url, body, quote, c,
                                   n_warm + n_calls, plan.presign_vouchers)
            warm_lanes = await asyncio.to_thread(supply.lanes, n_warm)
            warm = await run_calls(session, url, body, warm_lanes)
            bad = Counter(x.kind for x in warm if x.kind != "ok")
            if bad:
                print(f"  warm-up {label}/C={c}: {dict(bad)}", file=sys.stderr)
            t_timed = time.perf_counter()
            lanes = await asyncio.to_thread(supply.lanes, n_calls)  # signed now, if ahead
            sign_s = time.perf_counter() - t_timed
            spy = spy_out = None
            if spy_dir:
                spy_out = spy_dir / f"{plan.scheme}-{plan.route}-{plan.chain}-{plan.db}-c{c}.folded"
                spy = spy_profile.start(gw.proc.pid, spy_out)
                await asyncio.sleep(1.0)  # py-spy attaches (the clock has not started)
            cpu0 = CpuSnapshot.take(gw.proc.pid, pg_data_dir, upstream_pid)
            calls = await run_calls(session, url, body, lanes)
            cpu1 = CpuSnapshot.take(gw.proc.pid, pg_data_dir, upstream_pid)
            if spy and spy_out:
                await asyncio.to_thread(spy_profile.stop, spy)
                report = spy_profile.summary(spy_out, len(calls))
                spy_out.with_suffix(".txt").write_text(report)
                print(f"  py-spy: {spy_out.with_suffix('.txt')}", file=sys.stderr)
            if time.perf_counter() - t_timed > supply.valid_for_s:
                print(f"  warning: {label}/C={c} ran past the payments' validity "
                      f"({supply.valid_for_s:.0f} s after signing): lower --calls", file=sys.stderr)
            level = summarize(plan, c, calls, cpu0, cpu1, sign_s, supply)
            carried = len(supply.deposits) + n_warm + n_calls
            level.costs = await asyncio.to_thread(
                costs, supply, [x.receipt for x in calls if x.kind == "ok"], gw.base, carried)
            print(f"  {label} C={c}: {level.ok}/{level.calls} ok, "
                  f"{level.calls_per_s:.1f} calls/s, p50 {level.latency_ms['p50']:.1f} ms, "
                  f"p99 {level.latency_ms['p99']:.0f} ms (prepared {n_calls} in {sign_s:.1f} s)",
                  file=sys.stderr)
            results.append(level)
    return results


def route_of(args: argparse.Namespace) -> tuple[str, bytes]:
    """The route's path and its request body."""
    if args.route == "chat":
        body: Any = {"model": args.model, "messages": [{"role": "user", "content": CHAT_PROMPT}]}
        path = "/v1/chat/completions"
    else:
        body, path = args.body, f"/v1/marketplace/api/{args.skill}"
    return path, json.dumps(body, separators=(",", ":")).encode()


def gateway_env(plan: Plan, args: argparse.Namespace, upstream_url: str | None) -> dict[str, str]:
    env = dict(e.split("=", 1) for e in args.env)
    if upstream_url:  # the chat model's provider (OpenAI-compatible) is the mock
        env |= {"OPENAI_BASE_URL": upstream_url, "OPENAI_API_KEY": "sk-bench-mock"}
    if plan.scheme == "free":
        env["PAYWIRE_FREE_MODELS"] = args.model
    if plan.scheme == "channel":  # the gas meter reads what the claimer sent soon after (not 60 s)
        env.setdefault("PAYWIRE_CHAIN_FEES_INTERVAL_SECONDS", str(FEE_METER_INTERVAL_S))
    return env


def run_gateway(plan: Plan, pg: Any, levels: list[int], args: argparse.Namespace,
                upstream: subprocess.Popen[bytes] | None, upstream_url: str | None) -> list[Level]:
    """The `levels` of one plan on one fresh gateway (on PostgreSQL a fresh schema too)."""
    database_url = pg.fresh_url() if pg is not None else None  # a role and schema of its own
    gw = start_gateway(args.source, database_url, gateway_env(plan, args, upstream_url))
    try:
        path, body = route_of(args)
        url = f"{gw.base}{path}"
        quote = None if plan.scheme == "free" else get_quote(url, body, plan.chain, plan.scheme)
        n_calls = args.calls or DEFAULT_CALLS[(plan.scheme, plan.chain)]
        price = f"{quote.amount} atomic units per call" if quote else "served free"
        print(f"{plan.scheme}/{plan.chain}/{plan.db}: {gw.base}{path}, {price}", file=sys.stderr)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(run_levels(gw, plan, levels, n_calls, args.warmup, url, body, quote,
                                         pg.data_dir if pg else None,
                                         upstream.pid if upstream else None, args.py_spy))
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


@contextlib.contextmanager
def mock_upstream(args: argparse.Namespace) -> Any:
    """The bench's lean OpenAI-compatible mock on loopback (chat route only): its process, URL."""
    if args.route != "chat":
        yield None, None
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(args.mock), "--port", str(port), "--delay-ms",
                             str(args.mock_delay_ms)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the mock upstream {args.mock} did not start") from None
                time.sleep(0.05)  # poll interval
        yield proc, f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------------- output


def print_tables(levels: list[Level]) -> None:
    head = (f"{'scheme':9} {'chain':6} {'db':10} {'C':>3} {'calls':>6} {'ok':>6} {'calls/s':>8} "
            f"{'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'srv cpu':>8} {'of sys':>6} {'cli cpu':>8} "
            f"{'db cpu':>7} {'up cpu':>7} {'box':>5} {'others':>6}  errors")
    print("\ncalls (latency of ok calls in ms; CPU in ms per call: the server process (of which in "
          "its kernel: sys), this client, PostgreSQL, the mock upstream; box: busy % of all cores, "
          "others: of which none of these)")
    print(head)
    for lv in levels:
        lat = lv.latency_ms
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(lv.outcomes.items()) if k != "ok") or "-"
        print(f"{_scheme(lv):9} {lv.chain:6} {lv.db:10} {lv.concurrency:>3} {lv.calls:>6} "
              f"{lv.ok:>6} {lv.calls_per_s:>8.1f} {lat['p50']:>7.2f} {lat['p90']:>7.2f} "
              f"{lat['p99']:>7.1f} {lat['max']:>7.1f} {lv.server_cpu_ms_per_call:>8.2f} "
              f"{lv.server_sys_ms_per_call:>6.2f} "
              f"{lv.client_cpu_ms_per_call:>8.2f} {lv.db_cpu_ms_per_call:>7.2f} "
              f"{lv.upstream_cpu_ms_per_call:>7.2f} {lv.box_busy_pct:>4.0f}% "
              f"{lv.others_busy_pct:>5.0f}%  {errors}")
    names: dict[str, None] = {}
    for lv in levels:
        names.update(dict.fromkeys(k for k in lv.stages_mean_ms if k not in ("total", "outside")))
    cols = [*names, "total", "outside", "latency"]
    print("\nServer-Timing stage means in ms (all: every ok call; tail: the slowest 1% of ok calls, "
          f"at least {TAIL_MIN}; outside = latency - total)")
    print(f"{'scheme':9} {'chain':6} {'db':10} {'C':>3} {'':4} " + " ".join(f"{n:>8}" for n in cols))
    for lv in levels:
        for label, means, lat in (("all", lv.stages_mean_ms, lv.latency_ms["mean"]),
                                  ("tail", lv.tail_stages_mean_ms, _tail_latency(lv))):
            row = {**means, "latency": lat}
            cells = " ".join(f"{row[n]:>8.2f}" if n in row else f"{'-':>8}" for n in cols)
            print(f"{_scheme(lv):9} {lv.chain:6} {lv.db:10} {lv.concurrency:>3} {label:4} {cells}")
    print_costs(levels)


def _scheme(lv: Level) -> str:
    return {"presigned": "chan-pre", "live": "chan-live"}.get(lv.vouchers, lv.scheme)


def print_costs(levels: list[Level]) -> None:
    """The quote against what was paid, and the gas per call (EVM)."""
    paid = [lv for lv in levels if lv.costs]
    if not paid:
        return
    print("\ncosts per ok call (atomic USDC units; gas from the receipts; channel: its deposits "
          "measured, claim + sweep modelled, chain_gas.py)")
    print(f"{'scheme':9} {'chain':6} {'db':10} {'C':>3} {'quote':>7} {'paid':>9} {'gas/call':>9} "
          f"{'gas/tx':>8}  channel: deposit gas, claim+sweep gas, calls carried, steady gas/call")
    for lv in paid:
        k = lv.costs
        gas = f"{k['gas_per_call']:>9.0f}" if "gas_per_call" in k else f"{'-':>9}"
        per_tx = f"{k['gas_per_tx_mean']:>8.0f}" if "gas_per_tx_mean" in k else f"{'-':>8}"
        chan = (f"  {k['deposit_gas_mean']:.0f} x {k['deposits']}, {k['claim_and_sweep_gas']}, "
                f"{k['calls_carried']}, {k['steady_gas_per_call']:.0f} (SDK deposit "
                f"{k['sdk_deposit_atomic']})") if "deposits" in k else ""
        setup = f"  (approve: {k['setup_gas']} gas once)" if "setup_gas" in k else ""
        claimed = {kind: v for kind, v in k.get("metered", {}).items() if kind in ("claim", "sweep")}
        if claimed:  # what the gateway's claimer did meanwhile: [transactions, gas] per kind
            setup += (f"  claimer so far: {claimed}, with the deposits "
                      f"{k['metered_gas_per_call']:.0f} gas/call")
        print(f"{_scheme(lv):9} {lv.chain:6} {lv.db:10} {lv.concurrency:>3} "
              f"{k['quote_atomic']:>7} {k['paid_mean_atomic']:>9.1f} {gas} {per_tx}{chan}{setup}")


def _tail_latency(lv: Level) -> float:
    ok = sorted(s["ms"] for s in lv.samples if s["kind"] == "ok")
    tail = ok[len(ok) - lv.tail_calls:] if lv.tail_calls else []
    return sum(tail) / len(tail) if tail else math.nan


# ---------------------------------------------------------------------- main


def _no_nan(value: Any) -> Any:
    """NaN (a figure with no calls behind it) and infinity (no validity limit) as null: strict
    JSON."""
    if isinstance(value, float) and not math.isfinite(value):
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


def plans_of(args: argparse.Namespace) -> list[Plan]:
    """Every (db, scheme, chain) to measure, in that order; each on gateways of its own."""
    schemes = [s.strip() for s in args.scheme.split(",") if s.strip()]
    unknown = set(schemes) - set(SCHEMES)
    if unknown:
        raise SystemExit(f"--scheme: unknown {sorted(unknown)}; choose among {SCHEMES}")
    if args.route != "chat" and {"upto", "free"} & set(schemes):
        raise SystemExit("upto and free need a route priced from its request that can be served "
                         "free: --route chat")
    chains = ["evm", "solana"] if args.chain == "both" else [args.chain]
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    presign = args.vouchers == "presigned" or (args.vouchers == "auto" and args.route == "resource")
    plans = []
    for db in dbs:
        for scheme in schemes:
            on = ["none"] if scheme == "free" else [c for c in chains if scheme not in EVM_ONLY or
                                                    c == "evm"]
            plans += [Plan(scheme, chain, db, args.route, presign) for chain in on]
    return plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", default="exact",
                    help=f"comma-separated, measured in this order: {', '.join(SCHEMES)} "
                         "(upto and channel on EVM only; free: the route served free)")
    ap.add_argument("--chain", choices=["evm", "solana", "both"], default="both")
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    ap.add_argument("--calls", type=int, default=0,
                    help=f"timed calls per level (default: {DEFAULT_CALLS})")
    ap.add_argument("--warmup", type=int, default=5,
                    help="uncounted calls before each level (at least C)")
    ap.add_argument("--route", choices=["resource", "chat"], default="resource",
                    help="resource: --skill, a fixed price; chat: --model's chat completions, "
                         "priced from the request, from the mock upstream")
    ap.add_argument("--skill", default="token-count-508", help="a fixed-price marketplace resource")
    ap.add_argument("--body", type=json.loads, default=None,
                    help="the resource's JSON request body (default: its file's first example)")
    ap.add_argument("--model", default="gpt-4o", help="the chat route's model")
    ap.add_argument("--vouchers", choices=["auto", "presigned", "live"], default="auto",
                    help="channel vouchers signed ahead (the route's charge is fixed) or each on "
                         "the previous receipt (auto: presigned on the resource route)")
    ap.add_argument("--mock", type=Path, default=MOCK_UPSTREAM, help="the mock upstream script")
    ap.add_argument("--mock-delay-ms", type=float, default=0.0,
                    help="the mock upstream's delay before answering")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for paywire serve (repeatable)")
    ap.add_argument("--reuse-server", action="store_true",
                    help="run all levels of a plan on one server (default: a fresh one per level)")
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the tree to serve (default this one; e.g. a `git archive` export of a "
                         "commit, to measure it while the working tree changes)")
    ap.add_argument("--json", type=Path, help="write the raw figures (every call) here")
    ap.add_argument("--py-spy", type=Path, metavar="DIR",
                    help="sample the gateway with py-spy during each timed phase; its stacks and a "
                         "summary per call into DIR (spy_profile.py)")
    args = ap.parse_args()
    if args.py_spy:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.body is None:
        args.body = body_for(args.skill)
    plans = plans_of(args)

    pg = None
    levels: list[Level] = []
    started = time.time()
    try:
        with mock_upstream(args) as (upstream, upstream_url):
            for plan in plans:
                if plan.db == "postgresql" and pg is None:
                    from tests.support.postgres import start_postgres

                    pg = start_postgres()
                # A fresh server per level by default: every level starts from the same state
                # (new chains, empty ledger), so levels compare and their order does not matter.
                groups = [args.concurrency] if args.reuse_server else [[c] for c in args.concurrency]
                for group in groups:
                    levels += run_gateway(plan, pg if plan.db == "postgresql" else None, group,
                                          args, upstream, upstream_url)
    finally:
        if pg is not None:
            from tests.support.postgres import stop_postgres

            stop_postgres(pg)
    print_tables(levels)
    if args.json:
        meta = {"started": started, "cpus": os.cpu_count(), "route": args.route,
                "skill": args.skill, "body": args.body, "model": args.model,
                "mock_delay_ms": args.mock_delay_ms, "concurrency": args.concurrency,
                "warmup": args.warmup, "python": sys.version.split()[0],
                "source": str(args.source), "reuse_server": args.reuse_server}
        doc = _no_nan({"meta": meta, "levels": [asdict(lv) for lv in levels]})
        args.json.write_text(json.dumps(doc, indent=1, allow_nan=False))
        print(f"\nraw figures: {args.json}")


if __name__ == "__main__":
    main()
