"""Settings from the environment. Missing or contradictory production settings stop startup
with a message naming the variable; with none of them, paywire runs on its local devnet."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from payments.networks import NetworkInfo, lookup_network


class ConfigError(ValueError):
    """A setting is missing, malformed or contradicts another; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    public_url: str = ""
    data_dir: Path = Path(".paywire")
    database_url: str = ""
    devnet: bool = True
    networks: tuple[NetworkInfo, ...] = ()
    evm_pay_to: str = ""
    solana_pay_to: str = ""
    facilitator_url: str = ""
    evm_facilitator_key: str = field(default="", repr=False)
    evm_rpc_url: str = ""
    solana_facilitator_key: str = field(default="", repr=False)
    solana_rpc_url: str = ""
    max_body_bytes: int = 1024 * 1024
    header_timeout_seconds: int = 10  # a request's headers must arrive within this
    body_timeout_seconds: int = 60  # and its body within this after the headers
    max_timeout_seconds: int = 300
    resource_dirs: tuple[Path, ...] = ()
    a2a_payment_timeout_seconds: int = 900
    card_max_skills: int = 200
    model_margin: Decimal = Decimal("0")
    models_file: Path | None = None
    free_models: frozenset[str] = frozenset()
    # The environment the providers read their keys and base URLs from (OPENAI_API_KEY, ...).
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{(self.data_dir / 'paywire.db').resolve()}"

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env

        def get(name: str, default: str = "") -> str:
            return env.get(name, default).strip()

        def positive_int(name: str, default: int) -> int:
            raw = get(name)
            if not raw:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
            if value <= 0:
                raise ConfigError(f"{name} must be greater than 0, got {value}")
            return value

        base = dict(
            host=get("PAYWIRE_HOST", "127.0.0.1"),
            port=positive_int("PAYWIRE_PORT", 8000),
            public_url=get("PAYWIRE_PUBLIC_URL"),
            data_dir=Path(get("PAYWIRE_DATA_DIR", ".paywire")),
            database_url=get("PAYWIRE_DATABASE_URL"),
            max_body_bytes=positive_int("PAYWIRE_MAX_BODY_BYTES", 1024 * 1024),
            header_timeout_seconds=positive_int("PAYWIRE_HEADER_TIMEOUT_SECONDS", 10),
            body_timeout_seconds=positive_int("PAYWIRE_BODY_TIMEOUT_SECONDS", 60),
            max_timeout_seconds=positive_int("PAYWIRE_MAX_TIMEOUT_SECONDS", 300),
            resource_dirs=tuple(Path(p) for p in get("PAYWIRE_RESOURCE_DIRS").split(os.pathsep) if p),
            a2a_payment_timeout_seconds=positive_int("PAYWIRE_A2A_PAYMENT_TIMEOUT_SECONDS", 900),
            card_max_skills=positive_int("PAYWIRE_CARD_MAX_SKILLS", 200),
            model_margin=_margin(get("PAYWIRE_MODEL_MARGIN", "0")),
            models_file=Path(get("PAYWIRE_MODELS_FILE")) if get("PAYWIRE_MODELS_FILE") else None,
            free_models=frozenset(m.strip() for m in get("PAYWIRE_FREE_MODELS").split(",") if m.strip()),
            environ=dict(env),
        )
        if base["public_url"] and not base["public_url"].startswith(("http://", "https://")):
            raise ConfigError(
                f"PAYWIRE_PUBLIC_URL must start with http:// or https://, got {base['public_url']!r}"
            )
        raw_networks = get("PAYWIRE_NETWORKS", "devnet")
        if raw_networks == "devnet":
            production_vars = [
                n for n in ("PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO", "PAYWIRE_FACILITATOR_URL",
                            "PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_SOLANA_FACILITATOR_KEY")
                if get(n)
            ]
            if production_vars:
                raise ConfigError(
                    f"{', '.join(production_vars)} set but PAYWIRE_NETWORKS is 'devnet' (the "
                    "default); set PAYWIRE_NETWORKS to the networks to be paid on, e.g. 'base,solana'"
                )
            return Settings(devnet=True, **base)
        return Settings(devnet=False, **base, **_production(get, raw_networks))


def _production(get, raw_networks: str) -> dict:  # type: ignore[no-untyped-def]
    networks: list[NetworkInfo] = []
    for name in (n.strip() for n in raw_networks.split(",")):
        if not name:
            continue
        if name == "devnet":
            raise ConfigError("PAYWIRE_NETWORKS: 'devnet' cannot be combined with real networks")
        try:
            networks.append(lookup_network(name))
        except ValueError as exc:
            raise ConfigError(f"PAYWIRE_NETWORKS: {exc}") from None
    if not networks:
        raise ConfigError("PAYWIRE_NETWORKS is empty; name at least one network, e.g. 'base'")
    families = {n.family for n in networks}
    out = dict(
        networks=tuple(networks),
        evm_pay_to=get("PAYWIRE_EVM_PAY_TO"),
        solana_pay_to=get("PAYWIRE_SOLANA_PAY_TO"),
        facilitator_url=get("PAYWIRE_FACILITATOR_URL"),
        evm_facilitator_key=get("PAYWIRE_EVM_FACILITATOR_KEY"),
        evm_rpc_url=get("PAYWIRE_EVM_RPC_URL"),
        solana_facilitator_key=get("PAYWIRE_SOLANA_FACILITATOR_KEY"),
        solana_rpc_url=get("PAYWIRE_SOLANA_RPC_URL"),
    )
    if "evm" in families:
        _need_address(out["evm_pay_to"], "PAYWIRE_EVM_PAY_TO", evm=True)
    if "svm" in families:
        _need_address(out["solana_pay_to"], "PAYWIRE_SOLANA_PAY_TO", evm=False)
    keys = [n for n, fam in (("PAYWIRE_EVM_FACILITATOR_KEY", "evm"),
                             ("PAYWIRE_SOLANA_FACILITATOR_KEY", "svm")) if out[_attr(n)]]
    if out["facilitator_url"]:
        if keys:
            raise ConfigError(
                f"PAYWIRE_FACILITATOR_URL and {', '.join(keys)} are both set; use a remote "
                "facilitator (the URL) or an in-process one (the keys), not both"
            )
        if not out["facilitator_url"].startswith(("http://", "https://")):
            raise ConfigError("PAYWIRE_FACILITATOR_URL must be an http(s) URL")
        return out
    for family, key, rpc in (("evm", "PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_EVM_RPC_URL"),
                             ("svm", "PAYWIRE_SOLANA_FACILITATOR_KEY", "PAYWIRE_SOLANA_RPC_URL")):
        if family not in families:
            continue
        if not out[_attr(key)]:
            raise ConfigError(
                f"{key} is not set: an in-process facilitator needs it to settle on "
                f"{', '.join(n.v1_name for n in networks if n.family == family)} "
                "(or set PAYWIRE_FACILITATOR_URL to use a remote facilitator)"
            )
        if not out[_attr(rpc)]:
            raise ConfigError(f"{rpc} is not set: the in-process facilitator needs a node to settle on")
    return out


def _margin(raw: str) -> Decimal:
    try:
        value = Decimal(raw)
    except ArithmeticError:
        raise ConfigError(f"PAYWIRE_MODEL_MARGIN must be a decimal fraction such as 0.1, got {raw!r}"
                          ) from None
    if not value.is_finite() or not 0 <= value <= 10:
        raise ConfigError(f"PAYWIRE_MODEL_MARGIN must be between 0 and 10 (0.1 = +10%), got {raw}")
    return value


def _attr(var: str) -> str:
    return var.removeprefix("PAYWIRE_").lower()


def _need_address(value: str, var: str, *, evm: bool) -> None:
    if not value:
        raise ConfigError(f"{var} is not set: the address that receives payments on that network")
    if evm:
        from eth_utils import is_address

        if not is_address(value):
            raise ConfigError(f"{var} is not an EVM address (0x + 40 hex digits): {value!r}")
    else:
        from solders.pubkey import Pubkey

        try:
            Pubkey.from_string(value)
        except ValueError:
            raise ConfigError(f"{var} is not a base58 Solana address: {value!r}") from None
