"""docs/models.md's snippet runs as pasted: taken from the page verbatim, run as a file in a
subprocess against a live devnet gateway whose `openai` provider is a loopback stand-in, paying on
Base with the demo payer (the snippet's default) and on Solana (the key a user would set). What
it imports is what the page's `pip install` line installs, in a fresh virtualenv installed by that
line verbatim (offline, from the wheelhouse `make` fills)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.docs import doc_section, fenced, fresh_venv, pip_lines
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream


def models_section() -> str:
    return doc_section("docs/models.md", "Models")


SNIPPET = fenced(models_section(), "python")[0]


@dataclass
class Setup:
    gateway: LiveServer
    upstream: OpenAIUpstream
    folder: Path  # where the user runs the snippet: `.paywire` (the gateway's data) is here
    python: Path  # a fresh virtualenv's, with the page's pip line installed


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("readme")
    upstream = OpenAIUpstream("openai").start()
    gateway = start_server(folder / ".paywire", env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai"})
    python = fresh_venv(folder / "venv", pip_lines(models_section())[0])
    yield Setup(gateway, upstream, folder, python)
    gateway.stop()
    upstream.stop()


def run_snippet(setup: Setup, **env: str) -> subprocess.CompletedProcess[str]:
    path = setup.folder / "pay_a_model.py"
    path.write_text(SNIPPET)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PAYWIRE_", "OPENAI_", "PYTHONWARNINGS"))}
    return subprocess.run([str(setup.python), str(path)], cwd=setup.folder, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**clean, "PAYWIRE_URL": setup.gateway.url, **env})


@pytest.mark.parametrize("chain", ["evm", "solana"])
def test_the_models_snippet_pays_and_prints_the_answer(setup: Setup, chain: str) -> None:
    devnet = setup.gateway.devnet
    before = devnet.merchant_balances()
    # the snippet's default payer is the demo payer's EVM key; on Solana a user sets theirs
    env = {} if chain == "evm" else {"PAYWIRE_PAYER_KEY": devnet.keys.sol_payer}
    done = run_snippet(setup, **env)
    assert done.returncode == 0, done.stderr
    answer, paid = done.stdout.splitlines()
    assert answer.startswith("Hello from openai.")  # the upstream stand-in's reply
    network = "eip155:84532" if chain == "evm" else "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
    row = setup.gateway.ledger_rows(network=network, skill_id="gpt-4o-mini")[-1]
    assert row["state"] == "settled"
    assert paid == f"paid on {network}: transaction {row['tx_hash']}"
    after = devnet.merchant_balances()
    moved = getattr(after, chain) - getattr(before, chain)
    assert moved == row["amount_atomic"] > 0


def test_the_pip_line_installs_what_the_snippet_imports() -> None:
    line = pip_lines(models_section())[0]
    installed = _installed_by(shlex.split(line)[2:])
    from_dists = metadata.packages_distributions()
    imported = {m.group(1).split(".")[0] for m in
                re.finditer(r"^(?:from|import) ([\w.]+)", SNIPPET, flags=re.M)}
    third_party = imported - sys.stdlib_module_names
    assert third_party == {"httpx", "eth_account", "openai", "x402"}
    for module in third_party:
        dists = {canonicalize_name(d) for d in from_dists[module]}
        assert dists & installed, f"`{line}` does not install {module} ({dists})"


def _installed_by(requirements: list[str]) -> set[str]:
    """The distributions `pip install <requirements>` brings (with their extras), as installed
    here: the requirements' closure over the installed packages' metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            lines = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in lines:
            sub = Requirement(text)
            extras = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({**default_environment(), "extra": e})
                                         for e in extras):
                todo.append(sub)
    return {name for name, _ in seen}

