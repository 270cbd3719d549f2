"""Startup configuration: devnet by default; production settings checked, naming the variable."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.settings import ConfigError, Settings
from tests.support.docs import doc_section

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


def test_several_bad_values_are_reported_together_each_naming_its_variable() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"PAYWIRE_PORT": "abc", "PAYWIRE_MODEL_MARGIN": "x",
                           "OPENAI_BASE_URL": "ftp://x"})
    message = str(err.value)
    assert message.startswith("3 problems: ") and "\n" not in message
    assert "PAYWIRE_PORT must be a whole number from 1 to 65535, got 'abc'" in message
    assert "PAYWIRE_MODEL_MARGIN must be a decimal fraction from 0 to 10" in message
    assert "OPENAI_BASE_URL must be an http:// or https:// URL, got 'ftp://x'" in message
    assert len(err.value.problems) == 3


def test_every_production_problem_is_listed_and_no_secret_is_repeated() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"PAYWIRE_NETWORKS": "base,solana", "PAYWIRE_EVM_PAY_TO": "0x12",
                           "PAYWIRE_EVM_FACILITATOR_KEY": "not-a-key-s3cret",
                           "PAYWIRE_SOLANA_FACILITATOR_KEY": "0OIl-s3cret"})
    message = str(err.value)
    for variable in ("PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO", "PAYWIRE_EVM_FACILITATOR_KEY",
                     "PAYWIRE_EVM_RPC_URL", "PAYWIRE_SOLANA_FACILITATOR_KEY", "PAYWIRE_SOLANA_RPC_URL"):
        assert variable in message
    assert "s3cret" not in message


@pytest.mark.parametrize(("env", "needle"), [
    ({"PAYWIRE_DATABASE_URL": "sqlite:///x.db"}, "PAYWIRE_DATABASE_URL must use an async driver"),
    ({"PAYWIRE_DATABASE_URL": "postgresql://u:pw@h/db"}, "postgresql://u:***@h/db"),
    ({"PAYWIRE_MODELS_FILE": "/no/such/models.json"}, "PAYWIRE_MODELS_FILE names a file that does not"),
    ({"PAYWIRE_UPSTREAM_RETRIES": "-1"}, "PAYWIRE_UPSTREAM_RETRIES must be a whole number from 0 to 10"),
    ({"PAYWIRE_NETWORKS": " , "}, "PAYWIRE_NETWORKS is empty"),
    ({"PAYWIRE_FACILITATOR_TIMEOUT_SECONDS": "0"}, "PAYWIRE_FACILITATOR_TIMEOUT_SECONDS must be a "
                                                    "number of seconds above 0, got '0'"),
])
def test_each_value_is_checked(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert needle in str(err.value)
    assert "pw@" not in str(err.value)  # a database password is never repeated


def test_limits_are_settings_with_todays_defaults() -> None:
    import inspect

    from compat.openai_media import MAX_UPLOAD_BYTES
    from payments.facilitators import SETTLE_TIMEOUT, VERIFY_TIMEOUT
    from skills.models.upstream import UpstreamClient

    s = Settings.from_env({})
    assert s.max_upload_bytes == MAX_UPLOAD_BYTES
    assert (s.facilitator_verify_timeout_seconds, s.facilitator_settle_timeout_seconds) == (
        VERIFY_TIMEOUT, SETTLE_TIMEOUT)
    defaults = {name: p.default for name, p in inspect.signature(UpstreamClient).parameters.items()}
    assert defaults == {
        "connect_timeout": s.upstream_connect_timeout_seconds,
        "read_timeout": s.upstream_read_timeout_seconds,
        "retries_per_upstream": s.upstream_retries,
        "backoff_seconds": s.upstream_backoff_seconds,
        "failures_before_cooldown": s.upstream_failures_before_cooldown,
        "cooldown_seconds": s.upstream_cooldown_seconds,
        "urls_in_errors": s.devnet,  # the devnet's caller is its operator (agent/app.py)
    }
    s = Settings.from_env({"PAYWIRE_MAX_UPLOAD_BYTES": "4096", "PAYWIRE_UPSTREAM_RETRIES": "0",
                           "PAYWIRE_HEADER_TIMEOUT_SECONDS": "2.5"})
    assert (s.max_upload_bytes, s.upstream_retries, s.header_timeout_seconds) == (4096, 0, 2.5)


def test_the_upload_limit_reaches_the_upload_routes(tmp_path: Path) -> None:
    import httpx

    from tests.support.live_server import start_server

    live = start_server(tmp_path, env={"PAYWIRE_MAX_UPLOAD_BYTES": "4096"})
    try:
        r = httpx.post(f"{live.url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                       files={"file": ("a.wav", bytes(8192), "audio/wav")})
        assert r.status_code == 413 and "(4096 bytes)" in r.json()["error"]["message"]
    finally:
        live.stop()


def test_blank_is_unset_and_values_are_stripped() -> None:
    s = Settings.from_env({"PAYWIRE_PORT": "  ", "PAYWIRE_HOST": " 0.0.0.0 ", "OPENAI_API_KEY": ""})
    assert s.port == 8000 and s.host == "0.0.0.0" and s.openai_api_key is None


def test_provider_variables_are_declared_fields_and_keys_are_secret() -> None:
    from pydantic import SecretStr

    from skills.models.catalog import load_catalog

    fields = {info.validation_alias: info for info in Settings.model_fields.values()}
    for variables in load_catalog().provider_variables().values():
        for name in (variables.api_key, variables.base_url):
            assert name in fields, f"{name} is not a declared setting"
            assert fields[name].description
    s = Settings.from_env({"OPENAI_API_KEY": "sk-very-secret", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert isinstance(s.openai_api_key, SecretStr)
    assert "sk-very-secret" not in repr(s) and "sk-very-secret" not in str(s.effective())
    assert s.variables(["OPENAI_API_KEY", "OPENAI_BASE_URL"]) == {
        "OPENAI_API_KEY": "sk-very-secret", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}


def test_every_setting_is_documented() -> None:
    for variable, _default, meaning in Settings.reference():
        assert variable.isupper() and meaning, variable
    table = doc_section("docs/configuration.md", "Configuration (environment)")
    for variable, _default, _meaning in Settings.reference():
        assert f"`{variable}`" in table, f"docs/configuration.md's table misses {variable}"


def test_variables_hands_out_only_the_names_asked_for() -> None:
    s = Settings.from_env({"NANSEN_API_KEY": "n-key", "AWS_SECRET_ACCESS_KEY": "aws", "BLANK": " "})
    assert s.variables(["NANSEN_API_KEY", "BLANK", "UNSET"]) == {"NANSEN_API_KEY": "n-key"}


PROBE = {
    "id": "env-probe", "name": "Env probe", "description": "Says which variables it can read.",
    "categories": ["Developer"], "price": "0.001", "method": "POST",
    "env": ["PROBE_DECLARED"],
    "kind": "python", "handler": "tests.support.hooked_resources:variables",
}


def test_a_resource_sees_only_the_variables_resource_files_declare(tmp_path: Path) -> None:
    from agent.app import build_registry
    from skills.models.upstream import UpstreamClient
    from skills.resource_context import ResourceContext

    folder = tmp_path / "resources"
    folder.mkdir()
    (folder / "env-probe.json").write_text(json.dumps(PROBE))
    settings = Settings.from_env({
        "PAYWIRE_RESOURCE_DIRS": str(folder), "PAYWIRE_DATA_DIR": str(tmp_path),
        "PROBE_DECLARED": "declared", "NANSEN_API_KEY": "n-key",  # declared (a built-in forwarder)
        "AWS_SECRET_ACCESS_KEY": "aws-secret", "OPENAI_API_KEY": "sk-openai", "HOME": "/root",
    })
    context = ResourceContext()
    registry = build_registry(settings, UpstreamClient(), context)
    skill = registry.get("env-probe")
    assert skill is not None
    names = ["PROBE_DECLARED", "NANSEN_API_KEY", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "HOME"]
    result = asyncio.run(skill.operation(None).run({"names": names}))
    assert result.body == {"PROBE_DECLARED": "declared", "NANSEN_API_KEY": "n-key",
                           "AWS_SECRET_ACCESS_KEY": "", "OPENAI_API_KEY": "", "HOME": ""}
    assert set(context.environ) == {"PROBE_DECLARED", "NANSEN_API_KEY"}
    assert set(context.environ) <= context.declared


def test_built_in_resources_declare_every_variable_their_code_reads() -> None:
    from skills.resource_files import BUILTIN_DIR, declared_variables
    from skills.resources import attention_report, attention_sources, menu_image, webhook_test

    def declared(resource_id: str) -> set[str]:
        return set(declared_variables(json.loads((BUILTIN_DIR / f"{resource_id}.json").read_text())))

    attention = {attention_report.DEADLINE_ENV, "CRYPTOPANIC_API_KEY", "LUNARCRUSH_API_KEY",
                 "X_BEARER_TOKEN", "COINGECKO_DEMO_API_KEY", "COINGECKO_PRO_API_KEY",
                 "WIKIMEDIA_USER_AGENT", "PAYWIRE_PUBLIC_URL"}
    for source in attention_report.SOURCES:
        attention |= {source.base_env, source.timeout_env}
    assert attention <= declared("token-attention-report")
    assert {s.base_env for s in (attention_sources.NEWS, attention_sources.MENTIONS)} <= attention
    assert {menu_image.MODEL_ENV} <= declared("restaurant-menu-image-generate")
    assert {webhook_test.ALLOW_ENV, webhook_test.CA_FILE_ENV} <= declared("webhook-test-payload")
    assert {"NANSEN_API_KEY", "NANSEN_BASE_URL"} <= declared("v1beta1-token-screener-historical")
    assert {"PAYWIRE_ERROR_EXPLAIN_MODEL"} <= declared("error-explain")
