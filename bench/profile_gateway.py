#!/usr/bin/env python3
"""Where the gateway's CPU goes per call: serve paywire in this process, load it, profile it.

Serves the app exactly as `paywire serve` does (agent.serving), on the bench's model table and
mock upstream (started here from ../shared/bench), warms up, then runs ../shared/bench/load.py
for --duration seconds while one profiler watches this process:

  --profiler none     CPU µs per call and garbage-collector pauses only (no distortion)
  --profiler py-spy   sampling (py-spy must be installed: `.venv/bin/pip install py-spy`; it
                      needs ptrace, i.e. root or CAP_SYS_PTRACE), self and inclusive time
  --profiler cprofile deterministic, with call counts; inflates small Python functions ~2x

Every figure is per served call. Example:
  .venv/bin/python bench/profile_gateway.py --profiler py-spy -c 10 -d 20 [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.app import create_app  # noqa: E402
from agent.serving import Server, uvicorn_config  # noqa: E402
from agent.settings import Settings  # noqa: E402

PORT, MOCK_PORT = 8010, 9100


class GcWatch:
    """Collections per generation and the time they stalled the loop, while `on`."""

    def __init__(self) -> None:
        self.on, self._t0 = False, 0.0
        self.count: Counter[int] = Counter()
        self.total_s, self.max_s = 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.on:
            took = time.perf_counter() - self._t0
            self.count[info["generation"]] += 1
            self.total_s += took
            self.max_s = max(self.max_s, took)


def bench_env(data_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PAYWIRE_MODELS_FILE", str(ROOT / "bench" / "models.json"))
    env.setdefault("PAYWIRE_FREE_MODELS", "mock-gpt")
    env.setdefault("LOCAL_LLM_BASE_URL", f"http://127.0.0.1:{MOCK_PORT}/v1")
    env.setdefault("PAYWIRE_DATA_DIR", data_dir)
    env["PAYWIRE_PORT"] = str(PORT)
    return env


def start_mock(bench_dir: Path) -> subprocess.Popen[bytes]:
    mock = subprocess.Popen([sys.executable, str(bench_dir / "mock_upstream.py"), "--port", str(MOCK_PORT)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{MOCK_PORT}/health", timeout=1)
            return mock
        except OSError:
            time.sleep(0.1)
    mock.kill()
    raise SystemExit("the mock upstream did not start")


async def run_load(args: argparse.Namespace, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = tf.name
    cmd = [sys.executable, str(args.bench_dir / "load.py"), "--url", f"http://127.0.0.1:{PORT}/v1",
           "-c", str(args.concurrency), "-d", str(seconds), "--json-out", out]
    if args.stream:
        cmd.append("--stream")
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    printed, _ = await proc.communicate()
    result = json.loads(await asyncio.to_thread(Path(out).read_text))
    os.unlink(out)
    result["printed"] = printed.decode()
    return result


def start_py_spy(out: str, seconds: float) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return subprocess.Popen([exe, "record", "-p", str(os.getpid()), "-r", "2000", "-d", str(int(seconds)),
                             "-f", "raw", "-o", out, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(args: argparse.Namespace, server: Server) -> None:
    while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, no event)
        await asyncio.sleep(0.05)
    await run_load(args, args.warmup)
    watch, profile, spy = GcWatch(), None, None
    spy_out = tempfile.mktemp(suffix=".folded")
    if args.profiler == "py-spy":
        spy = start_py_spy(spy_out, args.duration)
        await asyncio.sleep(1.0)  # py-spy attaches
    elif args.profiler == "cprofile":
        profile = cProfile.Profile()
        profile.enable()
    watch.on, cpu0 = True, time.process_time()
    result = await run_load(args, args.duration)
    cpu, watch.on = time.process_time() - cpu0, False
    if profile is not None:
        profile.disable()
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    calls = max(1, result["requests"])
    print(result["printed"])
    print(f"gateway CPU {cpu / calls * 1e6:.0f} µs/call over {calls} calls "
          f"(includes the profiler's own cost when profiling)")
    print(f"gc: {dict(sorted(watch.count.items()))} collections by generation, "
          f"{watch.total_s / calls * 1e6:.1f} µs/call, longest pause {watch.max_s * 1000:.1f} ms")
    if profile is not None:
        report_cprofile(profile, calls, args.top)
    if spy is not None:
        report_folded(spy_out, calls, args.top)
        os.unlink(spy_out)
    server.should_exit = True


def _where(path: str) -> str:
    """A file as its package-relative path (site-packages, the stdlib and the repo stripped)."""
    path = re.sub(r".*site-packages/", "", path)
    path = re.sub(r".*/lib/python3\.\d+/", "stdlib/", path)
    return path.replace(str(ROOT) + "/", "")


def _package(where: str) -> str:
    """The top folder of a file: aiohttp, uvicorn, skills... (stdlib/asyncio for the stdlib)."""
    parts = where.split(":")[0].split("/")
    return "/".join(parts[:2]) if parts[0] == "stdlib" and len(parts) > 2 else parts[0]


def _print_table(title: str, rows: list[tuple[str, float]], total: float, calls: int, top: int) -> None:
    print(f"\n== {title}")
    for name, value in rows[:top]:
        print(f"{value / total:6.1%} {value / calls * 1e6:8.1f} µs/call  {name}")


def report_cprofile(profile: cProfile.Profile, calls: int, top: int) -> None:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for (file, line, func), (_cc, ncalls, tottime, _ct, _callers) in stats.items():
        where = _where(file)
        own[f"{func} ({where}:{line}) x{ncalls / calls:.1f}"] += tottime
        packages[_package(where) if file != "~" else "builtins"] += tottime
    total = sum(own.values()) or 1.0
    print(f"\ncProfile: {total / calls * 1e6:.0f} µs/call of profiled Python time")
    _print_table("self time by package", packages.most_common(), total, calls, top)
    _print_table("self time by function (xN: calls per served call)", own.most_common(), total, calls, top)


def report_folded(path: str, calls: int, top: int, rate: float = 2000.0) -> None:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += int(n)
        for frame in set(frames):
            inclusive[frame] += int(n)
        own[frames[-1]] += int(n)
        packages[_package(frames[-1].rsplit("(", 1)[-1].rstrip(")"))] += int(n)
    total_s = total / rate
    print(f"\npy-spy: {total} samples, {total_s / calls * 1e6:.0f} µs/call on Python stacks "
          "(C work such as socket writes shows as the Python function that called it)")
    scale = [(k, v / rate) for k, v in packages.most_common()]
    _print_table("self time by package", scale, total_s or 1, calls, top)
    _print_table("self time by function", [(k, v / rate) for k, v in own.most_common()], total_s or 1,
                 calls, top)
    _print_table("inclusive time", [(k, v / rate) for k, v in inclusive.most_common()], total_s or 1,
                 calls, top)


def _frame(raw: str) -> str:
    match = re.match(r"(.*) \((.*?):\d+\)$", raw)
    return f"{match[1]} ({_where(match[2])})" if match else raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiler", choices=["none", "py-spy", "cprofile"], default="none")
    ap.add_argument("-c", "--concurrency", type=int, default=10)
    ap.add_argument("-d", "--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    args = ap.parse_args()
    mock = start_mock(args.bench_dir)
    try:
        with tempfile.TemporaryDirectory() as data_dir:
            settings = Settings.from_env(bench_env(data_dir))
            server = Server(uvicorn_config(create_app(settings), host="127.0.0.1", port=PORT,
                                           log_level="warning"))

            async def both() -> None:
                await asyncio.gather(server.serve(), measure(args, server))

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(both())
    finally:
        mock.terminate()


if __name__ == "__main__":
    main()
