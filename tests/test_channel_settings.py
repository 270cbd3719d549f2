"""Payment channels' settings (issue 23 §2): off unless an authorizer key is set, bounds checked
naming the variable, the key masked and checked like the facilitator keys."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agent.settings import ConfigError, Settings

EVM = "0x" + "12" * 20
PRODUCTION = {"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": EVM,
              "PAYWIRE_EVM_FACILITATOR_KEY": "0x" + "1" * 64, "PAYWIRE_EVM_RPC_URL": "http://node"}


def test_channels_are_on_on_the_devnet_and_off_in_production_without_a_key() -> None:
    s = Settings.from_env({})
    assert s.devnet and s.channels_on and s.channel_authorizer_key is None  # the devnet's own key
    assert not Settings.from_env(PRODUCTION).channels_on
    assert s.channel_withdraw_delay_seconds == 3600
    assert s.channel_min_deposit_usd == Decimal("0.25")


def test_an_authorizer_key_turns_channels_on_and_is_never_shown() -> None:
    key = "0x" + "ab" * 32
    s = Settings.from_env({**PRODUCTION, "PAYWIRE_CHANNEL_AUTHORIZER_KEY": key})
    assert s.channels_on and s.secret("channel_authorizer_key") == key
    assert key not in repr(s)


@pytest.mark.parametrize(("env", "variable"), [
    ({"PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS": "899"}, "PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS"),
    ({"PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS": "2592001"}, "PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS"),
    ({"PAYWIRE_CHANNEL_MIN_DEPOSIT_USD": "0"}, "PAYWIRE_CHANNEL_MIN_DEPOSIT_USD"),
    ({"PAYWIRE_CHANNEL_MIN_DEPOSIT_USD": "NaN"}, "PAYWIRE_CHANNEL_MIN_DEPOSIT_USD"),
])
def test_out_of_range_values_stop_startup_naming_the_variable(
        env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env(env)


def test_a_key_that_cannot_sign_stops_startup_without_repeating_it() -> None:
    bad = "0x" + "zz" * 32
    with pytest.raises(ConfigError, match="PAYWIRE_CHANNEL_AUTHORIZER_KEY") as raised:
        Settings.from_env({**PRODUCTION, "PAYWIRE_CHANNEL_AUTHORIZER_KEY": bad})
    assert bad not in str(raised.value)


def test_claims_must_be_seen_well_inside_the_withdrawal_delay() -> None:
    key = {"PAYWIRE_CHANNEL_AUTHORIZER_KEY": "0x" + "ab" * 32}
    fine = Settings.from_env({**PRODUCTION, **key, "PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS": "900"})
    assert fine.channel_poll_seconds == 30 and fine.channel_sync_seconds == 120
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({**PRODUCTION, **key, "PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS": "900",
                           "PAYWIRE_CHANNEL_SYNC_SECONDS": "200"})
    assert "PAYWIRE_CHANNEL_SYNC_SECONDS" in str(refused.value)
    assert "a quarter of PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS (900 s)" in str(refused.value)


def test_the_deposit_method_is_eip3009_unless_permit2_is_asked_for() -> None:
    assert Settings.from_env({}).channel_deposit_method == "eip3009"
    permit2 = Settings.from_env({"PAYWIRE_CHANNEL_DEPOSIT_METHOD": "permit2"})
    assert permit2.channel_deposit_method == "permit2"
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"PAYWIRE_CHANNEL_DEPOSIT_METHOD": "permit"})
    assert str(refused.value) == ("PAYWIRE_CHANNEL_DEPOSIT_METHOD must be eip3009 or permit2, "
                                  "got 'permit'")
