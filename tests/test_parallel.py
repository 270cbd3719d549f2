"""How `make test` shares the suite out (tests/support/parallel.py): a small suite of its own run by
pytest with two pytest-xdist workers, as the Makefile runs the real one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each test notes when it began and ended, and on which worker; its work is a short pause.
NOTING = '''import os, time
import pytest

def note(name):
    began = time.monotonic()
    time.sleep(0.2)  # the test's work
    line = f"{{name}} {{os.environ['PYTEST_XDIST_WORKER']}} {{began}} {{time.monotonic()}}\\n"
    with open(os.environ["NOTES"], "a") as out:
        out.write(line)  # one append: the workers' lines never mix

{tests}
'''
PLAIN = '''@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    note(f"{name}-plain-{{i}}")
'''
ALONE = '''@pytest.mark.serial
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    note(f"{name}-alone-{{i}}")
'''


def _suite(folder: Path) -> None:
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n")
    # The folder is handed out first (tests/faults/ runs first), test_a beside it, then test_b on
    # the worker test_a frees: its serial tests would run while the folder's still do.
    files = {"tests/test_a.py": PLAIN, "tests/test_b.py": ALONE + PLAIN,
             "tests/faults/test_one.py": PLAIN, "tests/faults/test_two.py": PLAIN}
    for path, tests in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        name = Path(path).stem.removeprefix("test_")
        (folder / path).write_text(NOTING.format(tests=tests.format(name=name)))


def test_a_serial_test_runs_alone_and_a_shared_folder_on_one_worker(tmp_path: Path) -> None:
    _suite(tmp_path)
    notes = tmp_path / "notes.txt"
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env |= {"NOTES": str(notes), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.support.parallel", "-n", "2", "--dist", "loadfile", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("18 passed")
    ran = {}
    for line in notes.read_text().splitlines():
        name, worker, began, ended = line.split()
        ran[name] = (worker, float(began), float(ended))
    assert len(ran) == 18 and len({worker for worker, _, _ in ran.values()}) == 2
    for name, (_, began, ended) in ran.items():
        if "alone" in name:
            beside = [other for other, (_, b, e) in ran.items() if other != name and b < ended and began < e]
            assert beside == [], f"{name} ran beside {beside}"
    assert len({worker for name, (worker, _, _) in ran.items() if name.startswith(("one", "two"))}) == 1
