"""Secrets read from files (`<VAR>_FILE`, agent/key_files.py): the value is the file's (one trailing
newline dropped); a file its group or others may use, a missing, empty, oversized or non-regular
one, or VAR set beside VAR_FILE stop startup naming the variable and the file, never the value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from eth_account import Account

from agent.cli import main as cli
from agent.cli.common import CONFIG_ERROR
from agent.cli.database import db_settings
from agent.settings import ConfigError, PayerSettings, Settings

EVM_KEY = "0x" + "3c" * 32
SECRET = "sk-never-in-a-message"


def key_file(folder: Path, content: str, mode: int = 0o400, name: str = "key") -> Path:
    path = folder / name
    path.write_text(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("content", [SECRET, SECRET + "\n", SECRET + "\r\n"])
def test_the_value_is_the_files(tmp_path: Path, content: str) -> None:
    path = key_file(tmp_path, content)
    settings = Settings.from_env({"OPENAI_API_KEY_FILE": str(path)})
    assert settings.secret("openai_api_key") == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings.effective())


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_private_modes_are_accepted(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, SECRET, mode)
    assert Settings.from_env({"GROQ_API_KEY_FILE": str(path)}).secret("groq_api_key") == SECRET


@pytest.mark.parametrize("mode", [0o440, 0o404, 0o644, 0o620, 0o602, 0o410])
def test_a_file_others_may_use_is_refused(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, SECRET, mode)
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"PAYWIRE_METRICS_TOKEN_FILE": str(path)})
    message = str(refused.value)
    assert message.startswith(f"PAYWIRE_METRICS_TOKEN_FILE names {path}, which is open to its group "
                              f"or others (mode {mode:04o}); run `chmod 600 {path}`")
    assert SECRET not in message


@pytest.mark.parametrize(("make", "says"), [
    (lambda folder: folder / "missing", "cannot be read (No such file or directory)"),
    (lambda folder: folder, "is not a regular file"),
    (lambda folder: key_file(folder, "\n"), "is empty"),
    (lambda folder: key_file(folder, "k" * (64 * 1024 + 1)), "is larger than 65536 bytes"),
    (lambda folder: key_file(folder, "  \t\n"), "is empty"),
])
def test_an_unusable_file_is_refused_naming_variable_and_file(tmp_path: Path, make, says: str) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"ANTHROPIC_API_KEY_FILE": str(path)})
    assert str(refused.value).startswith(f"ANTHROPIC_API_KEY_FILE names {path}, which {says}")


def test_a_binary_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"\xff\xfe key")
    path.chmod(0o400)
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        Settings.from_env({"XAI_API_KEY_FILE": str(path)})


def test_the_variable_and_its_file_together_are_refused(tmp_path: Path) -> None:
    path = key_file(tmp_path, SECRET)
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"OPENAI_API_KEY": "sk-other", "OPENAI_API_KEY_FILE": str(path)})
    assert str(refused.value) == ("OPENAI_API_KEY and OPENAI_API_KEY_FILE are both set; set one of "
                                  "them (OPENAI_API_KEY_FILE names a file holding the value)")


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    loose = key_file(tmp_path, SECRET, 0o644, "loose")
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"OPENAI_API_KEY_FILE": str(loose),
                           "PAYWIRE_EVM_FACILITATOR_KEY_FILE": str(tmp_path / "absent")})
    assert refused.value.problems[0].startswith("PAYWIRE_EVM_FACILITATOR_KEY_FILE names")
    assert refused.value.problems[1].startswith("OPENAI_API_KEY_FILE names")


def test_only_secrets_and_the_database_url_are_read_from_files() -> None:
    assert "PAYWIRE_EVM_FACILITATOR_KEY" in Settings.file_variables()
    assert "PAYWIRE_DATABASE_URL" in Settings.file_variables()
    assert "PAYWIRE_PUBLIC_URL" not in Settings.file_variables()
    assert PayerSettings.file_variables() == ["PAYWIRE_PAYER_KEY"]
    # PAYWIRE_MODELS_FILE is a setting of its own (a model table), not a secret's file.
    assert "PAYWIRE_MODELS" not in {v for v, _, _ in Settings.reference()}


def test_production_keys_from_files_are_checked_as_keys(tmp_path: Path) -> None:
    good = key_file(tmp_path, EVM_KEY + "\n", name="evm")
    env = {"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": "0x" + "12" * 20,
           "PAYWIRE_EVM_RPC_URL": "https://node.example", "PAYWIRE_EVM_FACILITATOR_KEY_FILE": str(good)}
    assert Settings.from_env(env).secret("evm_facilitator_key") == EVM_KEY
    bad = key_file(tmp_path, "0xnot-a-key-" + SECRET, name="bad")
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env | {"PAYWIRE_EVM_FACILITATOR_KEY_FILE": str(bad)})
    assert "PAYWIRE_EVM_FACILITATOR_KEY is not an EVM private key" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_the_database_url_and_the_payer_key_from_files(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://paywire:" + SECRET + "@127.0.0.1/paywire"
    path = key_file(tmp_path, url + "\n", name="database-url")
    settings = Settings.from_env({"PAYWIRE_DATABASE_URL_FILE": str(path)})
    assert settings.db_url == url
    assert SECRET not in str(settings.effective())
    payer = key_file(tmp_path, EVM_KEY, name="payer")
    assert PayerSettings.from_env({"PAYWIRE_PAYER_KEY_FILE": str(payer)}).payer_key.get_secret_value() \
        == EVM_KEY  # type: ignore[union-attr]
    assert Account.from_key(EVM_KEY).address  # a usable key, as `paywire pay` reads it


def test_a_command_line_database_url_wins_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    path = key_file(tmp_path, "postgresql+asyncpg://a@127.0.0.1/file", name="database-url")
    monkeypatch.setenv("PAYWIRE_DATABASE_URL_FILE", str(path))
    given = "sqlite+aiosqlite:///" + str(tmp_path / "option.db")
    settings = db_settings(argparse.Namespace(database_url=given, data_dir=None))
    assert settings.db_url == given


def test_paywire_stops_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = key_file(tmp_path, SECRET, 0o644)
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(path))
    assert cli.main(["config"]) == CONFIG_ERROR
    err = capsys.readouterr().err
    assert err.startswith("paywire: configuration error: OPENAI_API_KEY_FILE names") and err.count("\n") == 1
    assert SECRET not in err
