"""Figures the tests measure on the way (the token estimator's calibration tables, devnet timings,
fault-injection counts) are kept out of the test output, which stays dots and the summary.

`report(topic, line)` appends a line to `test-artifacts/<topic>.txt` (gitignored; a run starts
each topic's file afresh the first time it reports to it). With PAYWIRE_TEST_REPORTS=1 the lines
are also printed at the end of the run, a section per topic (tests/conftest.py's terminal
summary)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "test-artifacts"
FLAG = "PAYWIRE_TEST_REPORTS"

_lines: dict[str, list[str]] = {}  # this run's lines, by topic


def report(topic: str, line: str) -> None:
    """Keep one line (or several, newline-separated) of figures under `topic` (a file name stem:
    letters, digits, `-`, `_`)."""
    if not re.fullmatch(r"[\w-]+", topic):
        raise ValueError(f"a report topic is a file name stem, got {topic!r}")
    first = topic not in _lines
    _lines.setdefault(topic, []).append(line)
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / f"{topic}.txt").open("w" if first else "a") as out:
        out.write(line.rstrip("\n") + "\n")


def shown() -> bool:
    """Whether the lines are printed at the end of the run (PAYWIRE_TEST_REPORTS=1)."""
    return os.environ.get(FLAG, "") == "1"


def reported() -> dict[str, list[str]]:
    """This run's lines, by topic, in the order reported."""
    return {topic: list(lines) for topic, lines in _lines.items()}
