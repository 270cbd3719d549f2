"""The production startup summary (agent/banner.py): what an operator needs to see, and no secret:
keys appear as the addresses they sign for, passwords and URL credentials are masked."""

from __future__ import annotations

import logging
from decimal import Decimal
from types import SimpleNamespace

import pytest
from eth_account import Account
from solders.keypair import Keypair

from agent.banner import RuntimeFacts, announce, production_banner, runtime_facts, summary
from agent.settings import Settings
from skills.registry import SkillRegistry
from skills.skill import Skill

EVM_KEY = "0x" + "5a" * 32
SOL_KEYPAIR = Keypair()
PASSWORD = "db-password-secret"
RPC_KEY = "alchemy-key-in-the-path"
SOL_RPC_KEY = "helius-key-in-the-query"
OPENAI_KEY = "sk-openai-secret"
METRICS_TOKEN = "metrics-token-0123456789"
ADMIN_TOKEN = "admin-token-" + "a" * 32
FACTS = RuntimeFacts(resources=7, models=105, models_available=12)


def in_process(**extra: str) -> Settings:
    return Settings.from_env({
        "PAYWIRE_NETWORKS": "base,solana", "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20,
        "PAYWIRE_SOLANA_PAY_TO": "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM",
        "PAYWIRE_EVM_FACILITATOR_KEY": EVM_KEY, "PAYWIRE_SOLANA_FACILITATOR_KEY": str(SOL_KEYPAIR),
        "PAYWIRE_EVM_RPC_URL": f"https://base-mainnet.g.alchemy.com/v2/{RPC_KEY}",
        "PAYWIRE_SOLANA_RPC_URL": f"https://mainnet.helius-rpc.com/?api-key={SOL_RPC_KEY}",
        "PAYWIRE_DATABASE_URL": f"postgresql+asyncpg://paywire:{PASSWORD}@db.internal:5432/paywire",
        "PAYWIRE_PUBLIC_URL": "https://pay.example.com", "PAYWIRE_TRUSTED_PROXIES": "127.0.0.1",
        "OPENAI_API_KEY": OPENAI_KEY, "PAYWIRE_METRICS_TOKEN": METRICS_TOKEN, **extra,
    })


def test_the_banner_says_what_runs_and_no_secret() -> None:
    text = production_banner(in_process(PAYWIRE_ADMIN_TOKEN=ADMIN_TOKEN), FACTS)
    for expected in [
        "public URL   https://pay.example.com",
        "base (eip155:8453), solana (solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp)",
        "eip155:8453  0x" + "12" * 20,
        "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp  9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM",
        f"in process: EVM signer {Account.from_key(EVM_KEY).address} via "
        "https://base-mainnet.g.alchemy.com/…",
        f"Solana fee payer {SOL_KEYPAIR.pubkey()} via https://mainnet.helius-rpc.com",
        "postgresql+asyncpg://paywire:***@db.internal:5432/paywire (PostgreSQL: replicas may share it)",
        "7 resources; 12 of 105 models available (providers configured: openai)",
        "behind proxies 127.0.0.1",
        "on at /metrics, token required",
        "admin API    on at /admin (bearer token)",
        "quotes 600/min (burst 120), refused payments 120/min (burst 30)",
    ]:
        assert expected in text, f"{expected!r} not in\n{text}"
    for secret in (EVM_KEY, EVM_KEY[2:], str(SOL_KEYPAIR), PASSWORD, RPC_KEY, SOL_RPC_KEY, OPENAI_KEY,
                   METRICS_TOKEN, ADMIN_TOKEN):
        assert secret not in text


def test_a_remote_facilitator_is_shown_without_credentials() -> None:
    settings = Settings.from_env({
        "PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20,
        "PAYWIRE_FACILITATOR_URL": "https://user:hunter2@f1.example/x402?token=abc,https://f2.example",
        "PAYWIRE_PUBLIC_URL": "http://pay.example.com", "PAYWIRE_RATE_QUOTES_PER_MINUTE": "0",
        "PAYWIRE_METRICS": "false", "PAYWIRE_LOG_FORMAT": "json",
    })
    rows = dict(summary(settings, FACTS))
    assert rows["facilitator"] == ("remote: https://f1.example/x402, https://f2.example (in order of "
                                   "preference)")
    assert "not https" in rows["public URL"]
    assert "SQLite: this machine only" in rows["database"]
    assert "X-Forwarded-* ignored" in rows["listening"]
    assert rows["metrics"] == "off" and rows["logs"] == "JSON lines"
    assert rows["admin API"] == "off (set PAYWIRE_ADMIN_TOKEN to serve it)"
    assert rows["rate limits"].startswith("per replica and client: quotes no limit")
    text = production_banner(settings, FACTS)
    assert "hunter2" not in text and "token=abc" not in text


def test_runtime_facts_count_what_is_sold() -> None:
    def skill(skill_id: str, kind: str, available: bool | None = None) -> Skill:
        info = None if available is None else (lambda: {"available": available})
        return Skill(id=skill_id, name=skill_id, description="", categories=(), run=None,  # type: ignore[arg-type]
                     price_usd=Decimal("0.01"), kind=kind, info=info)

    registry = SkillRegistry([skill("a", "resource"), skill("b", "resource"), skill("m1", "model", True),
                              skill("m2", "model", False), skill("help", "help")])
    facts = runtime_facts(SimpleNamespace(registry=registry))  # type: ignore[arg-type]
    assert facts == RuntimeFacts(resources=2, models=2, models_available=1)


def test_with_json_logs_the_summary_is_one_log_line(caplog: pytest.LogCaptureFixture,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    settings = in_process(PAYWIRE_LOG_FORMAT="json")
    runtime = SimpleNamespace(registry=SkillRegistry())
    with caplog.at_level(logging.INFO, logger="paywire.startup"):
        announce(settings, runtime)  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    (record,) = [r for r in caplog.records if r.name == "paywire.startup"]
    startup = record.startup  # type: ignore[attr-defined]
    assert startup["public_url"] == "https://pay.example.com"
    assert startup["pay_to"].count(";") == 1 and startup["facilitator"].count("; ") == 1
    assert EVM_KEY not in str(startup) and PASSWORD not in str(startup)


def test_text_logs_get_the_banner_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    announce(in_process(), SimpleNamespace(registry=SkillRegistry()))  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "PAYWIRE - production" in err and PASSWORD not in err
