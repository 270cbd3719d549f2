"""py-spy over a running gateway during paid_load.py's timed phase, and its summary per call.

py-spy (`pip install py-spy`, not a dependency; it needs ptrace: root or CAP_SYS_PTRACE) samples
the process without slowing it (--nonblocking) into raw folded stacks. The summary gives, per
timed call, the self time by package and by function, and the inclusive time of every frame:
where a call's CPU goes. C work (socket writes, SQLite, hashing) shows as the Python function
that called it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE_HZ = 1000
ROOT = Path(__file__).resolve().parent.parent


def py_spy_exe() -> str:
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise SystemExit("py-spy is not installed (pip install py-spy, or PY_SPY=/path/to/py-spy)")
    return exe


def start(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample `pid` until stop() into `out` (raw folded stacks)."""
    return subprocess.Popen([py_spy_exe(), "record", "-p", str(pid), "-r", str(RATE_HZ), "-f", "raw",
                             "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(spy: subprocess.Popen[bytes]) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def _where(path: str) -> str:
    path = re.sub(r".*site-packages/", "", path)
    path = re.sub(r".*/lib/python3\.\d+/", "stdlib/", path)
    return path.replace(str(ROOT) + "/", "")


def _frame(raw: str) -> str:
    match = re.match(r"(.*) \((.*?):\d+\)$", raw)
    return f"{match[1]} ({_where(match[2])})" if match else raw


def _package(frame: str) -> str:
    where = frame.rsplit("(", 1)[-1].rstrip(")")
    parts = where.split("/")
    return "/".join(parts[:2]) if parts[0] in ("stdlib", "agent", "payments", "skills") else parts[0]


def summary(path: Path, calls: int, top: int = 25) -> str:
    """Self time by package and by function, and inclusive time, in µs per call."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames or not n.isdigit():
            continue
        for frame in set(frames):
            inclusive[frame] += int(n)
        own[frames[-1]] += int(n)
        packages[_package(frames[-1])] += int(n)
    total = sum(own.values())
    per_call = 1e6 / RATE_HZ / max(1, calls)
    lines = [f"py-spy: {total} samples, {total * per_call:.0f} µs per call on Python stacks"]
    for title, counter in (("self time by package", packages), ("self time by function", own),
                           ("inclusive time", inclusive)):
        lines.append(f"== {title} (µs per call)")
        lines += [f"{n * per_call:8.1f}  {name}" for name, n in counter.most_common(top)]
    return "\n".join(lines)
