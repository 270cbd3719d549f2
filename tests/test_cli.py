"""The commands a new user runs: `paywire serve`, `curl`, `paywire pay`, `paywire skills check`."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.served_process import (
    PAYWIRE,
    ROOT,
    free_port,
    paywire_env,
    start_paywire,
    stop,
    wait_healthy,
)


@dataclass
class Served:
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    env = paywire_env(tmp_path_factory.mktemp("cli") / ".paywire")
    proc = start_paywire(port, env)
    served = Served(f"http://127.0.0.1:{port}", env, proc)
    yield served
    stop(served.proc)  # a test may have restarted the server: whichever process is current


def _pay(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`paywire pay` with every warning shown once (`-W default`, PYTHONWARNINGS unset), as a
    developer would see them: the tests check that it prints none."""
    env = {k: v for k, v in served.env.items() if k != "PYTHONWARNINGS"}
    python, *module = PAYWIRE
    return subprocess.run([python, "-W", "default", *module, "pay", *args], env=env, cwd=ROOT,
                          text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def test_serve_prints_the_devnet_banner_with_demo_payer_addresses(served: Served) -> None:
    info = httpx.get(f"{served.url}/devnet").json()
    served.proc.terminate()  # read the banner once the process is done with it
    served.proc.wait(timeout=15)
    banner = served.proc.stderr.read() if served.proc.stderr else ""
    assert "LOCAL TEST CHAIN" in banner
    assert info["networks"]["evm"]["demo_payer"] in banner
    assert info["networks"]["solana"]["demo_payer"] in banner
    # restart on the same port for the remaining tests, same data dir (same demo keys)
    port = served.url.rsplit(":", 1)[1]
    served.proc = subprocess.Popen([*PAYWIRE, "serve", "--port", port, "--log-level", "warning"],
                                   env=served.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, text=True)
    wait_healthy(served.url, served.proc)


@pytest.mark.parametrize("network", ["evm", "solana"])
def test_paywire_pay_pays_and_prints_result_and_receipt(served: Served, network: str) -> None:
    before = httpx.get(f"{served.url}/devnet").json()["networks"]
    key = "evm" if network == "evm" else "solana"
    url = f"{served.url}/v1/marketplace/api/token-count-508"
    out = _pay(served, url, "--data", '{"text": "Counting tokens, for real.", "model": "gpt-4o"}',
               "--network", network)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no dependency's warning (solana-py's deprecated Client, a socket left open)
    assert "HTTP 200" in out.stdout and '"tokens"' in out.stdout
    for field in ("transaction", "network", "payer", "amount"):
        assert f"  {field}" in out.stdout
    assert "5750 atomic units ($0.00575)" in out.stdout
    after = httpx.get(f"{served.url}/devnet").json()["networks"]
    assert after[key]["merchant_balance"] - before[key]["merchant_balance"] == 5750
    assert before[key]["demo_payer"] in out.stdout


def test_paywire_pay_refuses_to_pay_above_max(served: Served) -> None:
    before = httpx.get(f"{served.url}/devnet").json()["networks"]["evm"]["merchant_balance"]
    url = f"{served.url}/v1/marketplace/api/token-count-508"  # $0.00575
    out = _pay(served, url, "--data", '{"text": "hi", "model": "gpt-4o"}', "--max", "0.005", "--json")
    assert out.returncode == 2
    assert "above --max $0.005" in out.stderr and "$0.00575" in out.stderr
    after = httpx.get(f"{served.url}/devnet").json()["networks"]["evm"]["merchant_balance"]
    assert after == before


def test_paywire_pay_json_output_and_payer_key_from_environment(served: Served) -> None:
    from eth_account import Account

    account = Account.create()
    funded = httpx.post(f"{served.url}/devnet/faucet", json={
        "network": "base-sepolia", "address": account.address, "amount": 10_000}).json()
    assert funded["transaction"]
    env = {**served.env, "PAYWIRE_PAYER_KEY": account.key.hex()}
    out = subprocess.run(
        [*PAYWIRE, "pay", f"{served.url}/v1/marketplace/api/token-count-508", "--json",
         "--data", '{"messages": [{"role": "user", "content": "hi"}], "model": "claude-sonnet-4"}'],
        env=env, cwd=ROOT, text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == 200 and doc["paid_usd"] == "0.00575"
    assert doc["result"]["model_family"].startswith("anthropic")
    assert doc["receipt"]["payer"] == account.address and doc["receipt"]["success"] is True
    balance = httpx.get(f"{served.url}/devnet/balance",
                        params={"network": "base-sepolia", "address": account.address}).json()
    assert balance["balance"] == 10_000 - 5750


def test_curl_style_quote_offers_base_and_solana(served: Served) -> None:
    r = httpx.post(f"{served.url}/v1/marketplace/api/token-count-508", content=b"{}")
    assert r.status_code == 402
    assert {a["network"] for a in r.json()["accepts"]} == {"base-sepolia", "solana-devnet"}


def test_skills_check_explains_each_problem(tmp_path: Path) -> None:
    good = ROOT / "skills" / "builtin" / "token-count-508.json"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"id": "Bad Id", "price": 0.5, "categories": [], "kind": "magic"}))
    out = subprocess.run([*PAYWIRE, "skills", "check", str(good), str(bad)], cwd=ROOT, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 1
    assert "token-count-508.json: ok" in out.stdout
    for needle in ("missing field 'name'", "field 'id'", "decimal string", "field 'categories'",
                   "field 'kind'"):
        assert needle in out.stdout


def test_skills_check_takes_a_folder() -> None:
    out = subprocess.run([*PAYWIRE, "skills", "check", "skills/builtin"], cwd=ROOT, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert len(out.stdout.splitlines()) == 12
    assert "v1beta1-token-screener-historical, forward, $0.0115 per call; needs NANSEN_API_KEY" in out.stdout


def test_paywire_pay_pays_for_an_a2a_call(served: Served) -> None:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": "cli-1", "parts": [{"kind": "data", "data": {
            "skill": "token-count-508", "input": {"text": "over A2A", "model": "gpt-4o"}}}]}}}
    out = _pay(served, f"{served.url}/a2a", "--data", json.dumps(rpc), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["result"]["result"]["status"]["state"] == "completed"
    assert doc["receipt"]["success"] is True and doc["paid_usd"] == "0.00575"


def test_version() -> None:
    from agent.version import VERSION

    out = subprocess.run([*PAYWIRE, "--version"], cwd=ROOT, text=True, capture_output=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"paywire {VERSION}"


def test_serve_help_lists_every_setting() -> None:
    from agent.settings import Settings

    out = subprocess.run([*PAYWIRE, "serve", "--help"], cwd=ROOT, text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0
    for variable, _default, _meaning in Settings.reference():
        assert variable in out.stdout
    assert "PAYWIRE_PORT (default 8000): port to listen on" in out.stdout
    assert "paywire config" in out.stdout


def test_config_prints_the_effective_values_with_secrets_masked(tmp_path: Path) -> None:
    env = paywire_env(tmp_path, PAYWIRE_PORT="8123", OPENAI_API_KEY="sk-do-not-print",
                      NANSEN_API_KEY="nansen-do-not-print",
                      PAYWIRE_DATABASE_URL="postgresql+asyncpg://app:pw-do-not-print@db/paywire")
    out = subprocess.run([*PAYWIRE, "config"], env=env, cwd=ROOT, text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "do-not-print" not in out.stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()
             if line and not line.startswith("#")}
    assert lines["PAYWIRE_PORT"] == ["8123", "(environment)"]
    assert lines["PAYWIRE_HOST"] == ["127.0.0.1", "(default)"]
    assert lines["OPENAI_API_KEY"] == ["********", "(environment)"]
    assert lines["NANSEN_API_KEY"] == ["********", "(environment)"]  # declared by resource files
    assert lines["PAYWIRE_DATABASE_URL"][0] == "postgresql+asyncpg://app:***@db/paywire"
    bad = subprocess.run([*PAYWIRE, "config"], env={**env, "PAYWIRE_PORT": "abc"}, cwd=ROOT, text=True,
                         capture_output=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("paywire: configuration error: PAYWIRE_PORT must be a whole number")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of the parser, subcommands included, with the words that name it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_commands_help_describes_each_option_its_default_and_the_variables_it_reads(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Walks the parser, so a command added later is held to the same: each option (and
    argument) says what it is, one with a default says which, a command says which environment
    variables it reads (its epilog), and `--help` prints all of it."""
    from agent.cli.main import build_parser, main

    commands = list(_commands(build_parser()))
    assert {" ".join(path) for path, _ in commands} >= {
        "", "serve", "config", "pay", "mcp", "devnet", "skills", "skills check", "db", "db upgrade",
        "db current", "ledger"}
    for path, command in commands:
        name = " ".join(("paywire", *path))
        with pytest.raises(SystemExit) as exited:
            main([*path, "--help"])
        assert exited.value.code == 0
        printed = " ".join(capsys.readouterr().out.split())
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in command._actions)
        if leaf:
            assert command.epilog and "variable" in command.epilog, f"{name}: no epilog naming the variables"
        for action in command._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                for sub in action._choices_actions:
                    assert sub.help, f"{name} {sub.dest}: no help line"
                continue
            label = "/".join(action.option_strings) or action.dest
            assert action.help and action.help.strip(), f"{name} {label}: no help"
            described = " ".join(command._get_formatter()._expand_help(action).split())
            assert described in printed, f"{name} {label}: help not printed"
            default = action.default
            if default in (None, argparse.SUPPRESS) or isinstance(default, bool) or action.nargs == 0:
                continue
            assert "default" in described and str(default) in described, (
                f"{name} {label}: the help does not say its default ({default})")
