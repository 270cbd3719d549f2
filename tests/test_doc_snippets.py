"""The docs' client examples run as a user runs them: docs/mcp.md's snippet in a fresh virtualenv
(no system site packages) installed by the page's own `pip install` line, verbatim, offline from
the wheelhouse `make` fills (`.wheelhouse`, tests/support/docs.py), against a live devnet gateway;
and the `paywire mcp` configuration docs/mcp.md gives parses and names real options."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import WHEELHOUSE, doc_section, fenced, pip_lines
from tests.support.live_server import LiveServer, start_server

MCP_SECTION = doc_section("docs/mcp.md", "Use it from MCP")
EVM_NET = "eip155:84532"
PRICE = 5750  # token-count-508: 0.00575 USD in atomic USDC


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("docs")
    server = start_server(folder / ".paywire")
    yield server
    server.stop()


def fresh_venv(where: Path, pip_line: str) -> Path:
    """A new virtualenv at `where` with `pip_line` (the docs' text, verbatim) installed offline
    from the wheelhouse; its python."""
    if not WHEELHOUSE.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no wheelhouse at {WHEELHOUSE}: `make test` downloads it")
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: run `make test` (or `make lint`) once to fill it")
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    args = shlex.split(pip_line)
    assert args[:2] == ["pip", "install"], pip_line
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args[1:],
         "--no-index", "--find-links", str(WHEELHOUSE)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"`{pip_line}` failed offline:\n{done.stderr}"
    return python


def test_the_mcp_snippet_pays_from_a_venv_installed_as_the_page_says(
        gateway: LiveServer, tmp_path: Path) -> None:
    line = pip_lines(MCP_SECTION)[0]  # the bash block's; the prose quotes `pip install mcp` as a mistake
    python = fresh_venv(tmp_path / "venv", line)
    [snippet] = fenced(MCP_SECTION, "python")
    (tmp_path / "pay_a_tool.py").write_text(snippet)
    # the user's folder: the demo payer's keys where `make serve` wrote them
    (tmp_path / ".paywire").symlink_to(gateway.runtime.settings.data_dir)
    before = gateway.devnet.merchant_balances().evm
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAYWIRE_", "PYTHON"))}
    done = subprocess.run([str(python), "pay_a_tool.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**clean, "PAYWIRE_MCP_URL": f"{gateway.url}/mcp"})
    assert done.returncode == 0, done.stderr
    tools, result, paid = done.stdout.strip().splitlines()
    assert "token-count-508" in tools
    assert json.loads(result)["tokens"] > 0
    row = gateway.ledger_rows(network=EVM_NET, skill_id="token-count-508")[-1]
    assert row["state"] == "settled" and row["amount_atomic"] == PRICE
    assert paid == f"paid on {EVM_NET}: {row['tx_hash']}"
    assert gateway.devnet.merchant_balances().evm - before == PRICE


def test_the_paywire_mcp_configuration_names_real_options() -> None:
    from agent.cli.main import build_parser

    section = doc_section("docs/mcp.md", "Pay from a desktop agent")
    [config] = [json.loads(block) for block in fenced(section, "json")]
    server = config["mcpServers"]["paywire"]
    assert server["command"] == "paywire" and server["args"][0] == "mcp"
    options = build_parser().parse_args(server["args"])
    assert options.server == "https://gateway.example/mcp" and options.network == "evm"
    from agent.settings import PayerSettings
    documented = {variable for variable, _default, _meaning in PayerSettings.reference()}
    assert set(server["env"]) <= documented | {"PAYWIRE_PAYER_KEY_FILE"}
