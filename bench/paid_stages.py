#!/usr/bin/env python3
"""Where the time of a paid chat call goes: payment (verify, claim, settle) against the proxy.

Starts the bench's mock upstream (../shared/bench/mock_upstream.py) and `paywire serve` on the
bench's one-model table with `mock-gpt` priced (not free), then makes --calls sequential paid
chat completions per network with the same honest x402 client as `paywire pay`, on the devnet.
Prints, per network, p50 / p90 / max of every `Server-Timing` stage of the paid call, the
gateway's total, the client's wall time for the paid request, and the mock's own delay for
comparison: `run` minus the mock delay is the proxy's share.

  .venv/bin/python bench/paid_stages.py --calls 50 [--networks evm,solana] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from payments.devnet.keys import KEYS_FILE, DevnetKeys  # noqa: E402
from payments.payer import PayerKeys, pay  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not answer {url} within 60 s")


def parse_server_timing(header: str) -> dict[str, float]:
    stages = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            stages[name] = float(dur)
    return stages


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"{statistics.median(ordered):7.2f} {p90:7.2f} {ordered[-1]:7.2f}"


async def measure(url: str, keys: PayerKeys, network: str, calls: int, stream: bool,
                  solana_rpc: str) -> tuple[dict[str, list[float]], list[float]]:
    body = {"model": "mock-gpt", "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 32, "stream": stream}
    data = json.dumps(body).encode()
    stages: dict[str, list[float]] = {}
    walls: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        result = await pay(url, keys=keys, data=data, network=network, max_usd=Decimal("1"),
                           solana_rpc_url=solana_rpc)
        if result.status != 200 or result.receipt is None:
            raise SystemExit(f"paid call failed: HTTP {result.status} {result.body[:300]!r}")
        walls.append((time.perf_counter() - started) * 1000)
        for name, ms in parse_server_timing(result.headers.get("server-timing", "")).items():
            stages.setdefault(name, []).append(ms)
    return stages, walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50, help="paid calls per network")
    ap.add_argument("--networks", default="evm,solana")
    ap.add_argument("--stream", action="store_true", help="streamed chat completions")
    ap.add_argument("--mock-delay-ms", type=float, default=20.0)
    ap.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    args = ap.parse_args()

    mock_port, port = free_port(), free_port()
    data_dir = tempfile.mkdtemp(prefix="paywire-paid-stages-")
    mock = subprocess.Popen([sys.executable, str(args.bench_dir / "mock_upstream.py"), "--port",
                             str(mock_port), "--delay-ms", str(args.mock_delay_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    env = {**os.environ, "PAYWIRE_MODELS_FILE": str(ROOT / "bench" / "models.json"),
           "LOCAL_LLM_BASE_URL": f"http://127.0.0.1:{mock_port}/v1", "PAYWIRE_DATA_DIR": data_dir,
           "PAYWIRE_PORT": str(port)}
    env.pop("PAYWIRE_FREE_MODELS", None)
    server = subprocess.Popen([sys.executable, "-m", "agent.cli.main", "serve", "--log-level", "warning"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"http://127.0.0.1:{mock_port}/health", mock, "the mock upstream")
        wait_up(f"{base}/health", server, "paywire serve")
        devnet = json.loads(urllib.request.urlopen(f"{base}/devnet", timeout=5).read())
        solana_rpc = devnet["networks"]["solana"]["rpc_url"]
        demo = DevnetKeys(**json.loads((Path(data_dir) / KEYS_FILE).read_text()))
        keys = PayerKeys(evm_key=demo.evm_payer, solana_key=demo.sol_payer)
        url = f"{base}/v1/chat/completions"
        print(f"paid mock-gpt chat calls{' (streamed)' if args.stream else ''}, "
              f"mock delay {args.mock_delay_ms:g} ms, {args.calls} calls per network after 3 warm-ups")
        print(f"{'network':8} {'stage':14} {'p50':>7} {'p90':>7} {'max':>7}   (ms)")
        for network in args.networks.split(","):
            asyncio.run(measure(url, keys, network, 3, args.stream, solana_rpc))  # warm-up
            stages, walls = asyncio.run(measure(url, keys, network, args.calls, args.stream,
                                                solana_rpc))
            for name, values in stages.items():
                print(f"{network:8} {name:14} {summary(values)}")
            print(f"{network:8} {'client wall':14} {summary(walls)}   (402 round trip + paid call)")
    finally:
        for proc in (server, mock):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
