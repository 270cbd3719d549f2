"""Startup configuration: devnet by default; production settings checked, naming the variable."""

from __future__ import annotations

import pytest

from agent.settings import ConfigError, Settings

EVM = "0x" + "12" * 20
SOL = "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"


def test_default_is_devnet_on_loopback() -> None:
    s = Settings.from_env({})
    assert s.devnet and s.host == "127.0.0.1" and s.port == 8000
    assert s.base_url == "http://127.0.0.1:8000"
    assert s.db_url.startswith("sqlite+aiosqlite:///")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"PAYWIRE_NETWORKS": "base"}, "PAYWIRE_EVM_PAY_TO"),
        ({"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": "0x12"}, "PAYWIRE_EVM_PAY_TO"),
        ({"PAYWIRE_NETWORKS": "solana"}, "PAYWIRE_SOLANA_PAY_TO"),
        ({"PAYWIRE_NETWORKS": "solana", "PAYWIRE_SOLANA_PAY_TO": "nope"}, "PAYWIRE_SOLANA_PAY_TO"),
        ({"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": EVM}, "PAYWIRE_EVM_FACILITATOR_KEY"),
        ({"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": EVM,
          "PAYWIRE_EVM_FACILITATOR_KEY": "0x" + "1" * 64}, "PAYWIRE_EVM_RPC_URL"),
        ({"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": EVM, "PAYWIRE_FACILITATOR_URL": "https://f",
          "PAYWIRE_EVM_FACILITATOR_KEY": "0x" + "1" * 64}, "PAYWIRE_FACILITATOR_URL"),
        ({"PAYWIRE_NETWORKS": "ethereum"}, "PAYWIRE_NETWORKS"),
        ({"PAYWIRE_NETWORKS": "devnet,base"}, "PAYWIRE_NETWORKS"),
        ({"PAYWIRE_EVM_PAY_TO": EVM}, "PAYWIRE_NETWORKS"),
        ({"PAYWIRE_PORT": "eighty"}, "PAYWIRE_PORT"),
        ({"PAYWIRE_PUBLIC_URL": "example.com"}, "PAYWIRE_PUBLIC_URL"),
    ],
)
def test_bad_production_settings_stop_startup_naming_the_variable(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert variable in str(err.value)


def test_complete_production_settings() -> None:
    s = Settings.from_env({
        "PAYWIRE_NETWORKS": "base,solana", "PAYWIRE_EVM_PAY_TO": EVM,
        "PAYWIRE_SOLANA_PAY_TO": SOL, "PAYWIRE_FACILITATOR_URL": "https://facilitator.example",
        "PAYWIRE_PUBLIC_URL": "https://pay.example/",
    })
    assert not s.devnet
    assert [n.caip2 for n in s.networks] == ["eip155:8453", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"]
    assert s.base_url == "https://pay.example"
