"""What the code tells people to read exists: README.md is an index now (its pages moved to
docs/), so a message or docstring pointing at a guide names the page, and the page is there."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from agent.cli.serve import _banner
from agent.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "payments", "skills", "compat", "wellknown", "wire")
SUFFIXES = {".py", ".html", ".js"}  # code and what it serves (not sample data: a webhook's files)
_README = re.compile(r"(?:[\w./-]*/)?README(?:\.md)?")
_DOC = re.compile(r"(?<![\w/])docs/[\w-]+\.md")


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*")
                  if p.suffix in SUFFIXES and "__pycache__" not in p.parts)


def test_every_page_the_code_names_exists_and_no_bare_readme() -> None:
    problems = []
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{n}"
            for found in _README.findall(line):
                # a folder's own README (bench/, deploy/) is its guide; the top one is an index
                if "/" not in found or not (ROOT / found).is_file():
                    problems.append(f"{where}: {found!r} (name the docs/ page)")
            problems += [f"{where}: {page} does not exist" for page in _DOC.findall(line)
                         if not (ROOT / page).is_file()]
    assert problems == []


def test_the_devnet_banner_points_at_the_page_documenting_the_networks(tmp_path: Path) -> None:
    keys = SimpleNamespace(evm_payer_address="0xpayer", evm_merchant_address="0xmerchant",
                           sol_payer_address="payer", sol_merchant_address="merchant")
    banner = _banner(Settings.from_env({"PAYWIRE_DATA_DIR": str(tmp_path)}), SimpleNamespace(keys=keys))
    assert "PAYWIRE_NETWORKS" in banner and "README" not in banner
    [page] = _DOC.findall(banner)
    assert "| `PAYWIRE_NETWORKS` |" in (ROOT / page).read_text()  # its row in the settings table
