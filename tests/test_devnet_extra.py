"""The devnet is the optional extra `paywire[devnet]`: production runs without py-evm/eth-tester.

Each test runs paywire in a subprocess where `eth` (py-evm) and `eth_tester` cannot be imported,
as after a plain `pip install .`, and where any attempt to import them is reported on stderr.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.exact import register_exact_evm_facilitator

from payments.devnet.evm import EvmDevnet
from tests.support.facilitator_server import facilitator_app
from tests.support.live_server import bound_socket, run_in_thread
from tests.support.paying import EVM_NET, pay_once, receipt
from tests.support.served_process import ROOT, free_port, paywire_env, stop, wait_healthy

# Put first on sys.meta_path: the devnet extra's modules are "not installed".
WITHOUT_DEVNET_EXTRA = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("eth", "eth_tester"):
            print(f"blocked import of {name}", file=sys.stderr, flush=True)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""
PRODUCTION_IMPORTS = (
    "agent.app",
    "agent.cli.main",
    "agent.pipeline.gateway",
    "payments.processor",
    "payments.ledger",
    "payments.facilitators",
    "compat.openai_api",
    "wellknown.agent_card",
)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_DEVNET_EXTRA + code]


def _serve(port: int) -> list[str]:
    return _python(f"from agent.cli.main import main; sys.exit(main(['serve', '--port', '{port}', "
                   "'--log-level', 'warning']))")


def test_the_blocker_blocks() -> None:
    done = subprocess.run(_python("import eth"), cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr


def test_production_modules_import_without_the_extra() -> None:
    code = "".join(f"import {name}\n" for name in PRODUCTION_IMPORTS) + "print('imported')\n"
    done = subprocess.run(_python(code), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=paywire_env(ROOT / ".paywire-unused"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"
    assert "blocked import" not in done.stderr


def test_devnet_serve_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    data_dir = tmp_path / ".paywire"
    env = paywire_env(data_dir)
    env.pop("PAYWIRE_NETWORKS", None)  # the devnet: paywire's default
    done = subprocess.run(_serve(free_port()), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    message = lines[-1]
    assert all(line.startswith("blocked import") for line in lines[:-1]), done.stderr
    assert message.startswith("paywire: ") and "Traceback" not in done.stderr
    assert "pip install 'paywire[devnet]'" in message and "make serve" in message
    assert not (data_dir / "devnet-keys.json").exists()  # nothing written on the way out


def test_create_app_on_devnet_settings_without_the_extra_is_a_config_error(tmp_path: Path) -> None:
    code = """
from agent.app import create_app
from agent.settings import ConfigError, Settings
try:
    create_app(Settings.from_env({"PAYWIRE_DATA_DIR": sys.argv[1]}))
except ConfigError as exc:
    print(exc)
"""
    done = subprocess.run([*_python(code), str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=paywire_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "pip install 'paywire[devnet]'" in done.stdout


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[EvmDevnet, str]]:
    """An EVM chain and a remote facilitator settling on it (this process has the extra)."""
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(), minter_key=Account.create().key.hex())
    facilitator = x402FacilitatorSync()
    register_exact_evm_facilitator(facilitator, devnet.facilitator_signer(), networks=[EVM_NET])
    sock, port = bound_socket()
    server, thread = run_in_thread(facilitator_app(facilitator), sock)
    yield devnet, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


def test_production_serve_takes_a_payment_without_the_extra(
    chain: tuple[EvmDevnet, str], tmp_path: Path
) -> None:
    devnet, facilitator_url = chain
    merchant, payer = Account.create(), Account.create()
    devnet.mint(payer.address, 100_000)
    port = free_port()
    env = paywire_env(tmp_path / ".paywire", PAYWIRE_NETWORKS="base-sepolia",
                      PAYWIRE_EVM_PAY_TO=merchant.address, PAYWIRE_FACILITATOR_URL=facilitator_url)
    proc = subprocess.Popen(_serve(port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        resource = f"{url}/v1/marketplace/api/token-count-508"
        body = {"text": "Paid without py-evm in the gateway.", "model": "gpt-4o-mini"}
        paid = pay_once(url, resource, body, "0x" + payer.key.hex().removeprefix("0x"))
        assert paid.status_code == 200, paid.text
        assert receipt(paid)["success"] is True
        assert devnet.balance_of(merchant.address) == 5750
    finally:
        stop(proc)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "blocked import" not in stderr, stderr
