"""Settings: one typed object read from the environment (pydantic-settings).

Every variable paywire reads is a field here, with its default, its description (`paywire serve
--help` lists them, `paywire config` prints the effective values, secrets masked) and its check.
A bad value, or a missing or contradictory production setting, stops startup with one message
naming every variable at fault and what it accepts; with no production setting, paywire runs on
its local devnet.

Skills never see the environment: the model providers' keys and base URLs are fields here, and a
marketplace resource gets only the variables resource files declare (`Settings.variables`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from agent.edge.origins import origin_of
from agent.key_files import read_key_files
from payments.networks import NetworkInfo, lookup_network

if TYPE_CHECKING:
    from payments.chain_fees import FeePrices


class ConfigError(ValueError):
    """A setting is missing, malformed or contradicts another; the message names the variable
    (or the file) and what would be accepted. `problems` lists each problem."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]

    @staticmethod
    def of(problems: list[str]) -> ConfigError:
        """One error for several problems, on one line."""
        if len(problems) == 1:
            return ConfigError(problems[0], problems)
        return ConfigError(f"{len(problems)} problems: " + "; ".join(problems), problems)


# ---------------------------------------------------------------------------------------------
# Declaring a variable: its name, default, meaning and what it accepts (for the error message).

def _var(name: str, default: Any, description: str, *, accepts: str = "",
         secret: bool = False, in_repr: bool = True, from_file: bool = False,
         **constraints: Any) -> Any:
    """`secret`: masked wherever shown; it and `from_file` may be read from `<name>_FILE`."""
    extra: dict[str, Any] = {"accepts": accepts}
    if secret:
        extra["secret"] = True
    if secret or from_file:
        extra["from_file"] = True
    return Field(default, validation_alias=name, description=description, json_schema_extra=extra,
                 repr=in_repr and not secret, **constraints)


def _whole(name: str, default: int, description: str, *, least: int = 1,
           most: int | None = None) -> Any:
    accepts = f"a whole number from {least} to {most}" if most is not None else (
        f"a whole number of at least {least}")
    return _var(name, default, description, accepts=accepts, ge=least, le=most)


def _seconds(name: str, default: float, description: str, *, zero: bool = False) -> Any:
    if zero:
        return _var(name, default, description, accepts="a number of seconds, 0 or more", ge=0)
    return _var(name, default, description, accepts="a number of seconds above 0", gt=0)


def _url(name: str, description: str) -> Any:
    return _var(name, None, description, accepts="an http:// or https:// URL")


def _key(name: str, description: str) -> Any:
    return _var(name, None, description, secret=True)


def _url_problem(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http:// or https:// URL, got {value!r}"
    return None


# ---------------------------------------------------------------------------------------------
# The environment source: os.environ, or the mapping given to Settings.from_env (tests, bench).

_SOURCE: ContextVar[Mapping[str, str] | None] = ContextVar("paywire_settings_source", default=None)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The variables as read: stripped; blank counts as unset."""
    source = os.environ if env is None else env
    return {k: v.strip() for k, v in source.items() if isinstance(v, str) and v.strip()}


class _Environment(EnvSettingsSource):
    def _load_env_vars(self) -> Mapping[str, str | None]:
        return _environment(_SOURCE.get())


class _Problems(ValueError):
    """Cross-checks that failed, each a sentence naming its variables."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_PRODUCTION_ONLY = ("PAYWIRE_EVM_PAY_TO", "PAYWIRE_SOLANA_PAY_TO", "PAYWIRE_FACILITATOR_URL",
                    "PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_SOLANA_FACILITATOR_KEY",
                    "PAYWIRE_REFUND_KEY_SOLANA")
_EVM_KEY = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")
MEBIBYTE = 1024 * 1024


class _FromEnvironment(BaseSettings):
    """Settings read from the mapping `from_env` names (or the process environment) only: no
    .env file, no secrets directory."""

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any,
                                   env_settings: Any, dotenv_settings: Any,
                                   file_secret_settings: Any) -> tuple[Any, ...]:
        return (init_settings, _Environment(settings_cls, case_sensitive=True))

    @classmethod
    def reference(cls) -> list[tuple[str, str, str]]:
        """(variable, default as text, meaning) of every setting, in declaration order."""
        return [(_alias(info), _default_text(info), info.description or "")
                for info in cls.model_fields.values()]

    @classmethod
    def file_variables(cls) -> list[str]:
        """The variables that may be read from a file instead (`<VAR>_FILE`): the secrets, and
        the database URL (it may hold a password)."""
        return [_alias(info) for info in cls.model_fields.values() if _extra(info).get("from_file")]

    @classmethod
    def _source(cls, env: Mapping[str, str] | None) -> dict[str, str]:
        """The variables as read (`_environment`), with `<VAR>_FILE` files read in
        (agent/key_files.py); ConfigError naming each unusable one, before anything else."""
        values, problems = read_key_files(_environment(env), cls.file_variables())
        if problems:
            raise ConfigError.of(problems)
        return values


class Settings(_FromEnvironment):
    """paywire's configuration: one field per environment variable (`validation_alias`)."""

    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, extra="ignore",
                                      populate_by_name=True, validate_default=False)

    # --- where it listens and what it calls itself
    host: str = _var("PAYWIRE_HOST", "127.0.0.1", "address to listen on",
                     accepts="a host name or IP address")
    port: int = _whole("PAYWIRE_PORT", 8000, "port to listen on", most=65535)
    public_url: str = _var(
        "PAYWIRE_PUBLIC_URL", "", "public base URL used in quotes and the agent card (behind a "
        "proxy); default http://HOST:PORT", accepts="an http:// or https:// URL")
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = _var(
        "PAYWIRE_ALLOWED_ORIGINS", (), "web origins besides the gateway's own whose pages may POST "
        "to it and use /mcp (comma-separated, e.g. https://app.example.com); a browser request "
        "from any other Origin is refused 403 (DNS-rebinding protection); requests without Origin "
        "(non-browser clients) are not concerned", accepts="comma-separated origins "
        "(scheme://host[:port])")
    data_dir: Path = _var("PAYWIRE_DATA_DIR", Path(".paywire"),
                          "folder of the SQLite database and the devnet keys", accepts="a folder")
    database_url: str = _var(
        "PAYWIRE_DATABASE_URL", "", "database (SQLAlchemy URL with an async driver, e.g. "
        "postgresql+asyncpg://user:pass@host/db); default: SQLite in the data folder",
        accepts="a SQLAlchemy URL with an async driver", in_repr=False,
        from_file=True)  # it may hold a password

    # --- request limits
    max_body_bytes: int = _whole("PAYWIRE_MAX_BODY_BYTES", MEBIBYTE, "largest request body (413 above)")
    max_upload_bytes: int = _whole(
        "PAYWIRE_MAX_UPLOAD_BYTES", 25 * MEBIBYTE,
        "largest multipart upload (audio and image routes; OpenAI's own limit is 25 MiB)")
    header_timeout_seconds: float = _seconds(
        "PAYWIRE_HEADER_TIMEOUT_SECONDS", 10, "a request's headers must arrive within this (else "
        "408, connection closed)")
    body_timeout_seconds: float = _seconds(
        "PAYWIRE_BODY_TIMEOUT_SECONDS", 60, "a request's body must arrive within this after its headers")
    max_timeout_seconds: int = _whole("PAYWIRE_MAX_TIMEOUT_SECONDS", 300,
                                      "x402 maxTimeoutSeconds of quotes (how long a signed payment "
                                      "stays valid for settlement)")

    # --- limiting abuse (payments/rate_limits.py: per replica; payments/controls.py: shared)
    rate_quotes_per_minute: int = _whole(
        "PAYWIRE_RATE_QUOTES_PER_MINUTE", 600, "quotes (402s for calls without payment) a client "
        "address may get a minute on each replica; a payment that verifies gives its quote back; "
        "0 = no limit (429 with Retry-After above it)", least=0)
    rate_quotes_burst: int = _whole("PAYWIRE_RATE_QUOTES_BURST", 120,
                                    "quotes a client address may get at once")
    rate_payments_per_minute: int = _whole(
        "PAYWIRE_RATE_PAYMENTS_PER_MINUTE", 120, "refused payments (invalid, expired, not the "
        "quote's, denied) a client address, and a payer its signature proves, may send a minute on "
        "each replica; successful paid calls are not counted; 0 = no limit (429 with Retry-After "
        "above it)", least=0)
    rate_payments_burst: int = _whole("PAYWIRE_RATE_PAYMENTS_BURST", 30,
                                      "refused payments a client address or payer may send at once")
    rate_tracked_keys: int = _whole(
        "PAYWIRE_RATE_TRACKED_KEYS", 50_000, "client addresses (and payers) each limit remembers "
        "(the least recent forgotten first): bounds the limits' memory", least=100)
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = _var(
        "PAYWIRE_TRUSTED_PROXIES", (), "addresses or networks of the reverse proxies in front of "
        "paywire (comma-separated, e.g. 127.0.0.1,10.0.0.0/8): from these, X-Forwarded-For and "
        "X-Forwarded-Proto name the real client; default none (the headers are ignored, the "
        "peer's address is the client's)", accepts="comma-separated IP addresses or networks")
    controls_refresh_seconds: float = _seconds(
        "PAYWIRE_CONTROLS_REFRESH_SECONDS", 2.0, "how often each replica reads the operator's "
        "skill switches and payer deny list again (a change reaches the other replicas within this)")
    admin_token: SecretStr | None = _var(
        "PAYWIRE_ADMIN_TOKEN", None, "the operator API's token: when set, /admin serves revenue, "
        "payments, failures and pending settlements (JSON, CSV, and the operator page at /admin/), "
        "the skill switches and the payer deny list to 'Authorization: Bearer <this token>'; unset: "
        "nothing under /admin (the CLI still works)", secret=True,
        accepts="a token of 32 to 256 printable characters without spaces (e.g. `openssl rand "
        "-hex 32`)", min_length=32, max_length=256)

    # --- what operators watch (agent/observability/metrics.py, agent/observability/request_log.py)
    metrics: bool = _var(
        "PAYWIRE_METRICS", True, "serve Prometheus metrics at GET /metrics (they include revenue: set "
        "PAYWIRE_METRICS_TOKEN, or keep the port off the internet)", accepts="true or false")
    metrics_token: SecretStr | None = _var(
        "PAYWIRE_METRICS_TOKEN", None, "when set, GET /metrics answers only 'Authorization: Bearer "
        "<this token>'", secret=True, accepts="a token of 16 to 256 characters", min_length=16,
        max_length=256)
    log_format: Literal["text", "json"] = _var(
        "PAYWIRE_LOG_FORMAT", "text", "log lines as text, or as JSON objects (one per line, with the "
        "request id; a line per paid call on the paywire.calls logger)", accepts="text or json")

    # --- what is sold
    resource_dirs: Annotated[tuple[Path, ...], NoDecode] = _var(
        "PAYWIRE_RESOURCE_DIRS", (), f"extra folders of resource files ('{os.pathsep}'-separated)",
        accepts=f"'{os.pathsep}'-separated existing folders")
    models_file: Path | None = _var(
        "PAYWIRE_MODELS_FILE", None, "your own model table (same format as skills/models/models.json); "
        "default: the built-in table", accepts="an existing JSON file")
    model_margin: Decimal = _var(
        "PAYWIRE_MODEL_MARGIN", Decimal("0"), "fraction added to every model price (0.1 = +10%)",
        accepts="a decimal fraction from 0 to 10, such as 0.1 (+10%)", ge=0, le=10,
        allow_inf_nan=False)
    free_models: Annotated[frozenset[str], NoDecode] = _var(
        "PAYWIRE_FREE_MODELS", frozenset(), "model ids served free, e.g. a self-hosted model "
        "(comma-separated)", accepts="comma-separated model ids")
    a2a_payment_timeout_seconds: int = _whole(
        "PAYWIRE_A2A_PAYMENT_TIMEOUT_SECONDS", 900, "how long an A2A task waits for its in-band payment")
    card_max_skills: int = _whole("PAYWIRE_CARD_MAX_SKILLS", 200,
                                  "skills listed in the agent card (the card says where the rest are)")

    # --- calls to model providers (skills/models/upstream.py)
    upstream_connect_timeout_seconds: float = _seconds(
        "PAYWIRE_UPSTREAM_CONNECT_TIMEOUT_SECONDS", 5.0, "connecting to a model provider")
    upstream_read_timeout_seconds: float = _seconds(
        "PAYWIRE_UPSTREAM_READ_TIMEOUT_SECONDS", 120.0,
        "longest silence while reading a model provider's answer")
    upstream_retries: int = _whole("PAYWIRE_UPSTREAM_RETRIES", 1,
                                   "retries of one upstream before falling back to the next", least=0,
                                   most=10)
    upstream_backoff_seconds: float = _seconds(
        "PAYWIRE_UPSTREAM_BACKOFF_SECONDS", 0.05,
        "base of the jittered exponential backoff between retries", zero=True)
    upstream_failures_before_cooldown: int = _whole(
        "PAYWIRE_UPSTREAM_FAILURES_BEFORE_COOLDOWN", 3,
        "consecutive failures after which an upstream cools down (is tried last)")
    upstream_cooldown_seconds: float = _seconds(
        "PAYWIRE_UPSTREAM_COOLDOWN_SECONDS", 30.0, "how long a failing upstream cools down", zero=True)

    # --- payments: devnet by default, or real networks
    networks: Annotated[tuple[NetworkInfo, ...], NoDecode] = _var(
        "PAYWIRE_NETWORKS", (), "'devnet' (the default: test chains in process), or the networks "
        "to be paid on: base, base-sepolia, solana, solana-devnet (comma-separated)",
        accepts="'devnet' or comma-separated networks")
    evm_pay_to: str = _var("PAYWIRE_EVM_PAY_TO", "", "the address that receives payments on Base",
                           accepts="an EVM address (0x + 40 hex digits)")
    solana_pay_to: str = _var("PAYWIRE_SOLANA_PAY_TO", "", "the address that receives payments on Solana",
                              accepts="a base58 Solana address")
    facilitator_url: str = _var(
        "PAYWIRE_FACILITATOR_URL", "", "a remote x402 facilitator (its GET /supported lists what it "
        "settles), or several, comma-separated, in order of preference (a settle moves to the next "
        "only when nothing was sent); leave unset for an in-process one (the keys below)",
        accepts="an http:// or https:// URL, or several, comma-separated")
    facilitator_verify_timeout_seconds: float = _seconds(
        "PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS", 15.0, "longest wait for a remote facilitator's "
        "verify answer (then the next facilitator, or 503: nothing is charged)")
    facilitator_settle_timeout_seconds: float = _seconds(
        "PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS", 60.0, "longest wait for a remote facilitator's "
        "settle answer (then the payment is pending until the chain says; keep it above the "
        "facilitator's own receipt wait)")
    facilitator_timeout_seconds: float | None = _var(
        "PAYWIRE_FACILITATOR_TIMEOUT_SECONDS", None, "deprecated: when set, the default of both "
        "PAYWIRE_FACILITATOR_VERIFY_TIMEOUT_SECONDS and PAYWIRE_FACILITATOR_SETTLE_TIMEOUT_SECONDS",
        accepts="a number of seconds above 0", gt=0)
    settlement_receipt_timeout_seconds: float = _seconds(
        "PAYWIRE_SETTLEMENT_RECEIPT_TIMEOUT_SECONDS", 30.0, "in-process facilitator: how long a "
        "settlement waits for its receipt (EVM) or confirmation (Solana) before answering "
        "settlement_pending")
    facilitator_retry_max_seconds: float = _seconds(
        "PAYWIRE_FACILITATOR_RETRY_MAX_SECONDS", 30.0, "longest wait between two attempts to reach "
        "a facilitator that was down at startup (the gateway serves meanwhile; /readyz says 503)")
    evm_facilitator_key: SecretStr | None = _key(
        "PAYWIRE_EVM_FACILITATOR_KEY", "in-process facilitator: the EVM key that pays gas to settle")
    evm_rpc_url: str | None = _url("PAYWIRE_EVM_RPC_URL", "in-process facilitator: the EVM node")
    solana_facilitator_key: SecretStr | None = _key(
        "PAYWIRE_SOLANA_FACILITATOR_KEY", "in-process facilitator: the Solana fee payer's key (base58)")
    solana_rpc_url: str | None = _url("PAYWIRE_SOLANA_RPC_URL", "in-process facilitator: the Solana node")

    # --- settlement: leases, kept results, the reconciler (docs/architecture.md)
    settlement_lease_seconds: float = _seconds(
        "PAYWIRE_SETTLEMENT_LEASE_SECONDS", 30.0, "how long a claimed or settling payment stays "
        "with the replica working on it without being renewed (a dead replica's payments are "
        "taken over after this)")
    result_keep_seconds: float = _seconds(
        "PAYWIRE_RESULT_KEEP_SECONDS", 86_400.0, "how long a paid call's result is kept, so a "
        "retry with the same payment gets it instead of a second charge")
    result_keep_max_bytes: int = _whole(
        "PAYWIRE_RESULT_KEEP_MAX_BYTES", MEBIBYTE, "largest result kept for a retry (a larger "
        "one that is lost is run again for free, at most twice)", least=0)
    reconcile_interval_seconds: float = _seconds(
        "PAYWIRE_RECONCILE_INTERVAL_SECONDS", 15.0, "how often the reconciler asks the chain "
        "about payments whose settlement outcome is not known")
    pending_retry_seconds: int = _whole(
        "PAYWIRE_PENDING_RETRY_SECONDS", 5, "the Retry-After given while a settlement's outcome "
        "is not known yet", most=3600)

    # --- Solana refunds of what token-priced calls did not use (payments/refunds.py)
    refund_key_solana: SecretStr | None = _key(
        "PAYWIRE_REFUND_KEY_SOLANA", "the Solana pay-to wallet's key (base58): what a token-priced "
        "call paid with exact on Solana did not use is sent back from this wallet (it pays the "
        "transfers' fees: keep some SOL there); its address must be PAYWIRE_SOLANA_PAY_TO")
    refunds: bool | None = _var(
        "PAYWIRE_REFUNDS", None, "send Solana refunds: default on when PAYWIRE_REFUND_KEY_SOLANA is "
        "set (and on the devnet); false sends none (what is owed stays shown as owed)",
        accepts="true or false")
    refund_min_usd: Decimal = _var(
        "PAYWIRE_REFUND_MIN_USD", Decimal("0.01"), "the dust threshold: a payer gets a refund "
        "transfer once what it is owed in total reaches this (USD); less waits for later calls",
        accepts="a USD amount from 0 to 1000, such as 0.01", ge=0, le=1000, allow_inf_nan=False)
    refund_period_seconds: float = _seconds(
        "PAYWIRE_REFUND_PERIOD_SECONDS", 3600.0, "how often refunds are batched: one transfer "
        "per payer per period, by one replica")

    # --- payment channels, the batch-settlement scheme (issue 23 §2; payments/channels/)
    channel_authorizer_key: SecretStr | None = _key(
        "PAYWIRE_CHANNEL_AUTHORIZER_KEY", "the EVM key that signs channel claims as the "
        "receiverAuthorizer; channels are on when it is set (on the devnet: a generated key)")
    channel_withdraw_delay_seconds: int = _whole(
        "PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS", 3600, "how long a payer's withdrawal from a "
        "channel waits, so claims for what was used can land first", least=900, most=2_592_000)
    channel_min_deposit_usd: Decimal = _var(
        "PAYWIRE_CHANNEL_MIN_DEPOSIT_USD", Decimal("0.25"), "the smallest deposit that opens or "
        "tops up a channel (USD)", accepts="a USD amount above 0, such as 0.25", gt=0, le=1000,
        allow_inf_nan=False)
    channel_deposit_method: Literal["eip3009", "permit2"] = _var(
        "PAYWIRE_CHANNEL_DEPOSIT_METHOD", "eip3009", "how a payer's deposit into a channel moves "
        "its tokens (the 402's extra.assetTransferMethod): eip3009, a signed transfer "
        "authorization that needs no approval (USDC has ERC-3009); permit2, a Permit2 transfer, "
        "for tokens without ERC-3009 (the payer approves Permit2 once)",
        accepts="eip3009 or permit2")
    channel_claim_interval_seconds: float = _seconds(
        "PAYWIRE_CHANNEL_CLAIM_INTERVAL_SECONDS", 300.0, "the longest a channel's charges wait "
        "for a claim on chain")
    channel_claim_threshold_usd: Decimal = _var(
        "PAYWIRE_CHANNEL_CLAIM_THRESHOLD_USD", Decimal("1.00"), "a channel whose unclaimed charges "
        "reach this is claimed at once (USD)", accepts="a USD amount above 0, such as 1.00", gt=0,
        le=1_000_000, allow_inf_nan=False)
    channel_poll_seconds: float = _seconds(
        "PAYWIRE_CHANNEL_POLL_SECONDS", 30.0, "how often one replica reads the channels on chain "
        "and claims those due")
    channel_sync_seconds: float = _seconds(
        "PAYWIRE_CHANNEL_SYNC_SECONDS", 120.0, "how old paywire's read of a channel may be for a "
        "voucher to be checked against it (older: read again before the call)")
    channel_max_claims_per_batch: int = _whole(
        "PAYWIRE_CHANNEL_MAX_CLAIMS_PER_BATCH", 100, "channels claimed in one transaction",
        least=1, most=500)
    channel_settle_interval_seconds: float = _seconds(
        "PAYWIRE_CHANNEL_SETTLE_INTERVAL_SECONDS", 300.0, "the longest claimed funds wait to be "
        "moved to the pay-to address (the sweep)")

    # --- federation: other x402 sellers' resources resold (issue 24; federation/, docs/federation.md)
    federate: str | None = _var(
        "PAYWIRE_FEDERATE", None, "discovery catalogues to import resources from (a facilitator's "
        "/discovery/resources, a seller's /.well-known/x402), comma or space separated; "
        "`seller:URL` probes one seller's resource unpaid instead; more with `paywire federation add`",
        accepts="http(s) URLs, each optionally prefixed with seller:")
    federation_margin_percent: Decimal = _var(
        "PAYWIRE_FEDERATION_MARGIN_PERCENT", Decimal(10), "what an imported resource's price adds "
        "to its upstream's, in percent (plus PAYWIRE_FEDERATION_MARGIN_USD); rounded up to the "
        "atomic unit", accepts="a percent from 0 to 1000, such as 10", ge=0, le=1000,
        allow_inf_nan=False)
    federation_margin_usd: Decimal = _var(
        "PAYWIRE_FEDERATION_MARGIN_USD", Decimal(0), "a fixed amount added to every imported "
        "resource's price (USD)", accepts="a USD amount from 0 to 1000, such as 0.001", ge=0,
        le=1000, allow_inf_nan=False)
    federation_categories: str | None = _var(
        "PAYWIRE_FEDERATION_CATEGORIES", None, "import only offers in one of these categories "
        "(from PAYWIRE_FEDERATE)", accepts="comma-separated category names")
    federation_keywords: str | None = _var(
        "PAYWIRE_FEDERATION_KEYWORDS", None, "import only offers whose name, description or URL "
        "holds one of these words", accepts="comma-separated words")
    federation_networks: str | None = _var(
        "PAYWIRE_FEDERATION_NETWORKS", None, "import only offers payable on one of these networks",
        accepts="comma-separated network names, such as base,solana")
    federation_max_upstream_price_usd: Decimal | None = _var(
        "PAYWIRE_FEDERATION_MAX_UPSTREAM_PRICE_USD", None, "import only offers whose upstream "
        "price is at most this (USD)", accepts="a USD amount above 0", gt=0, le=1_000_000,
        allow_inf_nan=False)
    federation_allow_sellers: str | None = _var(
        "PAYWIRE_FEDERATION_ALLOW_SELLERS", None, "import only from these sellers",
        accepts="comma-separated host names or origins (https://host:port)")
    federation_deny_sellers: str | None = _var(
        "PAYWIRE_FEDERATION_DENY_SELLERS", None, "never import from these sellers",
        accepts="comma-separated host names or origins (https://host:port)")
    federation_payer_key: SecretStr | None = _key(
        "PAYWIRE_FEDERATION_PAYER_KEY", "the operator wallet that pays upstream sellers for "
        "imported resources: an EVM key (0x + 64 hex) and/or a Solana secret key (base58), comma "
        "separated, one per chain family; unset: imported resources are listed but answer 503")
    federation_max_per_call_usd: Decimal = _var(
        "PAYWIRE_FEDERATION_MAX_PER_CALL_USD", Decimal(1), "the most one upstream payment may be "
        "(USD)", accepts="a USD amount above 0", gt=0, le=1_000_000, allow_inf_nan=False)
    federation_max_per_seller_day_usd: Decimal = _var(
        "PAYWIRE_FEDERATION_MAX_PER_SELLER_DAY_USD", Decimal(10), "the most paid to one seller "
        "per UTC day (USD)", accepts="a USD amount above 0", gt=0, le=1_000_000,
        allow_inf_nan=False)
    federation_max_per_day_usd: Decimal = _var(
        "PAYWIRE_FEDERATION_MAX_PER_DAY_USD", Decimal(50), "the most paid to all sellers per UTC "
        "day (USD)", accepts="a USD amount above 0", gt=0, le=1_000_000, allow_inf_nan=False)
    federation_refresh_seconds: float = _seconds(
        "PAYWIRE_FEDERATION_REFRESH_SECONDS", 3600.0, "how often the sources are fetched again "
        "(by one replica); every replica follows within PAYWIRE_CONTROLS_REFRESH_SECONDS")
    federation_allow_networks: str | None = _var(
        "PAYWIRE_FEDERATION_ALLOW_NETWORKS", None, "networks federation may reach besides public "
        "addresses (a devnet on loopback: 127.0.0.1/32); cloud metadata addresses never",
        accepts="comma-separated CIDRs, such as 127.0.0.1/32")
    federation_timeout_seconds: float = _seconds(
        "PAYWIRE_FEDERATION_TIMEOUT_SECONDS", 30.0, "how long an upstream seller has to answer a "
        "request (a catalogue page, a probe, a paid call)")
    federation_max_answer_bytes: int = _whole(
        "PAYWIRE_FEDERATION_MAX_ANSWER_BYTES", 10 * 2**20, "the largest answer taken from an "
        "upstream seller (bytes)", least=1024, most=100 * 2**20)

    # --- chain fees: what paywire's transactions paid, read from the chain (payments/chain_fees.py)
    chain_fees_interval_seconds: float = _seconds(
        "PAYWIRE_CHAIN_FEES_INTERVAL_SECONDS", 60.0, "how often the fees of new transactions "
        "(settlements, refunds, channel claims) are read from the chain, by one replica")
    eth_usd: Decimal | None = _var(
        "PAYWIRE_ETH_USD", None, "ETH's price in USD, for the gas paid on EVM networks: shown in "
        "USD and taken from the margin; unset: shown in wei only, left out of the margin (no "
        "price is fetched)", accepts="a USD price above 0, such as 3150.25", gt=0, le=10_000_000,
        allow_inf_nan=False)
    sol_usd: Decimal | None = _var(
        "PAYWIRE_SOL_USD", None, "SOL's price in USD, for the fees paid on Solana: shown in USD "
        "and taken from the margin; unset: shown in lamports only, left out of the margin",
        accepts="a USD price above 0, such as 142.5", gt=0, le=10_000_000, allow_inf_nan=False)

    # --- model providers (the model table names these: Catalog.provider_variables())
    openai_api_key: SecretStr | None = _key("OPENAI_API_KEY", "OpenAI's API key")
    openai_base_url: str | None = _url("OPENAI_BASE_URL", "OpenAI-compatible base URL instead of OpenAI's")
    openrouter_api_key: SecretStr | None = _key("OPENROUTER_API_KEY", "OpenRouter's API key")
    openrouter_base_url: str | None = _url("OPENROUTER_BASE_URL", "OpenRouter's base URL")
    anthropic_api_key: SecretStr | None = _key("ANTHROPIC_API_KEY", "Anthropic's API key")
    anthropic_base_url: str | None = _url("ANTHROPIC_BASE_URL", "Anthropic's base URL")
    gemini_api_key: SecretStr | None = _key("GEMINI_API_KEY", "Google Gemini's API key")
    gemini_base_url: str | None = _url("GEMINI_BASE_URL", "Gemini's OpenAI-compatible base URL")
    groq_api_key: SecretStr | None = _key("GROQ_API_KEY", "Groq's API key")
    groq_base_url: str | None = _url("GROQ_BASE_URL", "Groq's base URL")
    together_api_key: SecretStr | None = _key("TOGETHER_API_KEY", "Together AI's API key")
    together_base_url: str | None = _url("TOGETHER_BASE_URL", "Together AI's base URL")
    deepseek_api_key: SecretStr | None = _key("DEEPSEEK_API_KEY", "DeepSeek's API key")
    deepseek_base_url: str | None = _url("DEEPSEEK_BASE_URL", "DeepSeek's base URL")
    mistral_api_key: SecretStr | None = _key("MISTRAL_API_KEY", "Mistral's API key")
    mistral_base_url: str | None = _url("MISTRAL_BASE_URL", "Mistral's base URL")
    xai_api_key: SecretStr | None = _key("XAI_API_KEY", "xAI's API key")
    xai_base_url: str | None = _url("XAI_BASE_URL", "xAI's base URL")
    fireworks_api_key: SecretStr | None = _key("FIREWORKS_API_KEY", "Fireworks' API key")
    fireworks_base_url: str | None = _url("FIREWORKS_BASE_URL", "Fireworks' base URL")
    elevenlabs_api_key: SecretStr | None = _key("ELEVENLABS_API_KEY", "ElevenLabs' API key")
    elevenlabs_base_url: str | None = _url("ELEVENLABS_BASE_URL", "ElevenLabs' base URL")
    local_llm_base_url: str | None = _url(
        "LOCAL_LLM_BASE_URL", "a local OpenAI-compatible server (Ollama, vLLM, llama.cpp), e.g. "
        "http://127.0.0.1:11434/v1")
    local_llm_api_key: SecretStr | None = _key("LOCAL_LLM_API_KEY", "the local server's key, if it takes one")

    # The variables as read (stripped, blanks left out), for `variables()`: never handed out whole.
    _environ: dict[str, str] = PrivateAttr(default_factory=dict)

    # ---- reading ----
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of `env` (default: the process environment). ConfigError naming every
        variable at fault."""
        token = _SOURCE.set(cls._source(env))
        try:
            settings = cls()
        except ValidationError as exc:
            raise ConfigError.of(_problems(exc)) from None
        finally:
            _SOURCE.reset(token)
        return settings

    def model_post_init(self, context: Any) -> None:
        self._environ = _environment(_SOURCE.get())

    # ---- derived values ----
    @property
    def devnet(self) -> bool:
        return not self.networks

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def refunds_on(self) -> bool:
        """Solana refunds are sent: PAYWIRE_REFUNDS, else whenever a refund key is there (on the
        devnet, its pay-to wallet's)."""
        if self.refunds is not None:
            return self.refunds
        return self.devnet or self._is_set("PAYWIRE_REFUND_KEY_SOLANA")

    @property
    def channels_on(self) -> bool:
        """The batch-settlement scheme is offered: a channel authorizer key is set, or on the
        devnet (its generated key)."""
        return self.devnet or self.channel_authorizer_key is not None

    @property
    def fee_prices(self) -> FeePrices:
        """The native tokens' USD prices the operator set (PAYWIRE_ETH_USD, PAYWIRE_SOL_USD)."""
        from payments.chain_fees import FeePrices

        return FeePrices.of(eth_usd=self.eth_usd, sol_usd=self.sol_usd)

    @property
    def facilitator_urls(self) -> tuple[str, ...]:
        """The remote facilitators, in order of preference (none: an in-process one)."""
        return tuple(self.facilitator_url.split(",")) if self.facilitator_url else ()

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{(self.data_dir / 'paywire.db').resolve()}"

    def secret(self, field: str) -> str:
        """A secret field's value ('' when unset)."""
        value = getattr(self, field)
        return value.get_secret_value() if value is not None else ""

    def variables(self, names: Iterable[str]) -> dict[str, str]:
        """The values of these variables, and of no other: a field's value (secrets revealed) when
        the variable is a field, else the environment's; unset and blank ones left out. What the
        assembly hands to skills: the model table's provider variables, the variables resource
        files declare."""
        out: dict[str, str] = {}
        for name in names:
            field = _FIELD_OF.get(name)
            value: Any = getattr(self, field) if field else None
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if not isinstance(value, str):
                value = self._environ.get(name)
            if value:
                out[name] = value
        return out

    # ---- describing ----
    def effective(self) -> list[tuple[str, str, bool]]:
        """(variable, effective value as text with secrets masked, set in the environment?)."""
        rows = []
        for name, info in type(self).model_fields.items():
            variable = _alias(info)
            rows.append((variable, _shown(name, getattr(self, name), info), variable in self._environ))
        return rows

    # ---- checks ----
    @field_validator("networks", mode="before")
    @classmethod
    def _networks(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        if raw.strip() == "devnet":
            return ()
        names = [n.strip() for n in raw.split(",") if n.strip()]
        if not names:
            raise ValueError("is empty; name at least one network, e.g. 'base', or 'devnet'")
        if "devnet" in names:
            raise ValueError("cannot combine 'devnet' with real networks")
        found = []
        for name in names:
            try:
                found.append(lookup_network(name))
            except ValueError as exc:
                raise ValueError(f"names an {exc}") from None
        return tuple(found)

    @field_validator("resource_dirs", mode="before")
    @classmethod
    def _folders(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        folders = tuple(Path(p) for p in raw.split(os.pathsep) if p.strip())
        missing = [str(p) for p in folders if not p.is_dir()]
        if missing:
            raise ValueError(f"names folders that do not exist: {', '.join(missing)} (expected "
                             f"'{os.pathsep}'-separated folders of resource files)")
        return folders

    @field_validator("models_file", mode="before")
    @classmethod
    def _table_file(cls, raw: Any) -> Any:
        if isinstance(raw, str) and not Path(raw).is_file():
            raise ValueError(f"names a file that does not exist: {raw!r} (expected a model table, "
                             "same format as skills/models/models.json)")
        return raw

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxies(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        import ipaddress

        found = []
        for entry in (e.strip() for e in raw.split(",")):
            try:
                network = ipaddress.ip_network(entry, strict=False)
                found.append(str(network.network_address) if network.num_addresses == 1
                             else str(network))
            except ValueError:
                raise ValueError(f"lists {entry!r}, which is not an IP address or network (e.g. "
                                 "127.0.0.1 or 10.0.0.0/8); list the proxies' addresses, comma-"
                                 "separated") from None
        return tuple(found)

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return tuple(origin_of(o) for o in raw.split(",") if o.strip())  # ValueError names it
        return raw

    @field_validator("free_models", mode="before")
    @classmethod
    def _model_ids(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return frozenset(m.strip() for m in raw.split(",") if m.strip())
        return raw

    @field_validator("admin_token")
    @classmethod
    def _admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        """Sent in a header: printable ASCII without spaces (the value is never repeated)."""
        if value is not None and not re.fullmatch(r"[!-~]+", value.get_secret_value()):
            raise ValueError("must be printable ASCII without spaces (e.g. `openssl rand -hex 32`)")
        return value

    @field_validator("facilitator_url")
    @classmethod
    def _facilitator_urls(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",")]
        if not any(urls):
            return ""
        if not all(urls):
            raise ValueError(f"has an empty entry: {value!r} (expected URLs separated by single commas)")
        for url in urls:
            problem = _url_problem(url)
            if problem:
                raise ValueError(problem if len(urls) == 1 else f"lists {url!r}, which {problem}")
        twice = sorted({u for u in urls if urls.count(u) > 1})
        if twice:
            raise ValueError(f"lists {', '.join(map(repr, twice))} more than once")
        return ",".join(urls)

    @model_validator(mode="before")
    @classmethod
    def _timeout_fallback(cls, data: Any) -> Any:
        """The deprecated PAYWIRE_FACILITATOR_TIMEOUT_SECONDS stands in for the verify and settle
        timeouts not set themselves (a bad value is reported once, as its own)."""
        if not isinstance(data, dict):
            return data
        legacy = data.get("PAYWIRE_FACILITATOR_TIMEOUT_SECONDS", data.get("facilitator_timeout_seconds"))
        try:
            usable = legacy is not None and float(legacy) > 0
        except (TypeError, ValueError):
            usable = False
        if not usable:
            return data
        data = dict(data)
        for name in ("facilitator_verify_timeout_seconds", "facilitator_settle_timeout_seconds"):
            alias = str(cls.model_fields[name].validation_alias)
            if alias not in data and name not in data:
                data[alias] = legacy
        return data

    @field_validator("public_url", "evm_rpc_url", "solana_rpc_url",
                     "openai_base_url", "openrouter_base_url", "anthropic_base_url", "gemini_base_url",
                     "groq_base_url", "together_base_url", "deepseek_base_url", "mistral_base_url",
                     "xai_base_url", "fireworks_base_url", "elevenlabs_base_url", "local_llm_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value:
            problem = _url_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("database_url")
    @classmethod
    def _database(cls, value: str) -> str:
        if not value:
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError("is not a SQLAlchemy database URL (e.g. postgresql+asyncpg://user:pass@"
                             "host/db or sqlite+aiosqlite:///path/paywire.db)") from None
        shown = url.render_as_string(hide_password=True)
        try:
            dialect = url.get_dialect()
        except NoSuchModuleError:
            raise ValueError(f"names an unknown database driver: {shown} (expected e.g. "
                             "postgresql+asyncpg:// or sqlite+aiosqlite://)") from None
        if not getattr(dialect, "is_async", False):
            raise ValueError(f"must use an async driver, got {shown} (e.g. postgresql+asyncpg:// "
                             "or sqlite+aiosqlite://)")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        problems = (self._devnet_problems() if self.devnet
                    else self._production_problems() + self._refund_problems()
                    + self._channel_problems()) + self._federation_problems()
        if problems:
            raise _Problems(problems)
        return self

    def _federation_problems(self) -> list[str]:
        """Sources, filters and the upstream wallet as federation/config.py reads them."""
        from federation import config
        from federation.model import Margin

        problems = []
        try:
            config.env_sources(self.federate, self.federation_filters(), Margin())
        except ValueError as exc:  # a network name, or a source that is not a URL
            problems.append(str(exc))
        key = self.secret("federation_payer_key")
        if key:
            try:
                config.payer_keys(key)
            except ValueError as exc:
                problems.append(str(exc))
        if self.federation_max_per_call_usd > self.federation_max_per_seller_day_usd:
            problems.append("PAYWIRE_FEDERATION_MAX_PER_CALL_USD is above "
                            "PAYWIRE_FEDERATION_MAX_PER_SELLER_DAY_USD: no call could be paid")
        return problems

    def federation_filters(self) -> Any:
        """The filters PAYWIRE_FEDERATE's sources are imported with (federation.model.Filters);
        ValueError naming a network that is not one."""
        from federation.config import filters_of

        try:
            return filters_of(categories=self.federation_categories,
                              keywords=self.federation_keywords, networks=self.federation_networks,
                              max_upstream_usd=self.federation_max_upstream_price_usd,
                              allow_sellers=self.federation_allow_sellers,
                              deny_sellers=self.federation_deny_sellers)
        except ValueError as exc:
            raise ValueError(f"PAYWIRE_FEDERATION_NETWORKS names an {exc}") from None

    def _is_set(self, variable: str) -> bool:
        value = getattr(self, _FIELD_OF[variable])
        return bool(value.get_secret_value() if isinstance(value, SecretStr) else value)

    def _devnet_problems(self) -> list[str]:
        production_vars = [n for n in _PRODUCTION_ONLY if self._is_set(n)]
        if production_vars:
            return [f"{', '.join(production_vars)} set but PAYWIRE_NETWORKS is 'devnet' (the "
                    "default); set PAYWIRE_NETWORKS to the networks to be paid on, e.g. 'base,solana'"]
        return []

    def _production_problems(self) -> list[str]:
        problems: list[str] = []
        families = {n.family for n in self.networks}
        if "evm" in families:
            problems += _address_problems(self.evm_pay_to, "PAYWIRE_EVM_PAY_TO", evm=True)
        if "svm" in families:
            problems += _address_problems(self.solana_pay_to, "PAYWIRE_SOLANA_PAY_TO", evm=False)
        keys = [n for n in ("PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_SOLANA_FACILITATOR_KEY")
                if self._is_set(n)]
        if self.facilitator_url:
            if keys:
                problems.append(
                    f"PAYWIRE_FACILITATOR_URL and {', '.join(keys)} are both set; use a remote "
                    "facilitator (the URL) or an in-process one (the keys), not both")
            return problems
        for family, key, rpc in (("evm", "PAYWIRE_EVM_FACILITATOR_KEY", "PAYWIRE_EVM_RPC_URL"),
                                 ("svm", "PAYWIRE_SOLANA_FACILITATOR_KEY", "PAYWIRE_SOLANA_RPC_URL")):
            if family not in families:
                continue
            if not self._is_set(key):
                problems.append(
                    f"{key} is not set: an in-process facilitator needs it to settle on "
                    f"{', '.join(n.v1_name for n in self.networks if n.family == family)} "
                    "(or set PAYWIRE_FACILITATOR_URL to use a remote facilitator)")
            else:
                problems += _key_problems(self.secret(_FIELD_OF[key]), key, evm=family == "evm")
            if not self._is_set(rpc):
                problems.append(f"{rpc} is not set: the in-process facilitator needs a node to settle on")
        return problems

    def _channel_problems(self) -> list[str]:
        """A channel authorizer key that cannot sign (its value is never repeated); claims that
        could not land before a payer's withdrawal does (x402 #3464: a withdrawal seen is claimed
        at once; the claimer must see it well inside the delay)."""
        if not self.channels_on:
            return []
        problems = _key_problems(self.secret("channel_authorizer_key"),
                                 "PAYWIRE_CHANNEL_AUTHORIZER_KEY", evm=True)
        seen_within = (self.channel_poll_seconds + self.channel_sync_seconds
                       + self.settlement_receipt_timeout_seconds)
        if seen_within >= self.channel_withdraw_delay_seconds / 4:
            problems.append(
                f"PAYWIRE_CHANNEL_POLL_SECONDS + PAYWIRE_CHANNEL_SYNC_SECONDS + "
                f"PAYWIRE_SETTLEMENT_RECEIPT_TIMEOUT_SECONDS ({seen_within:.0f} s) must stay under "
                f"a quarter of PAYWIRE_CHANNEL_WITHDRAW_DELAY_SECONDS "
                f"({self.channel_withdraw_delay_seconds} s): a payer's withdrawal must be seen and "
                "claimed against long before it can complete")
        return problems

    def _refund_problems(self) -> list[str]:
        """The refund key is the Solana pay-to wallet's, and refunds have a node to go through."""
        if not self._is_set("PAYWIRE_REFUND_KEY_SOLANA"):
            return ["PAYWIRE_REFUNDS is true but PAYWIRE_REFUND_KEY_SOLANA is not set: refunds are "
                    "sent from the Solana pay-to wallet, with its key (or set PAYWIRE_REFUNDS=false)"
                    ] if self.refunds else []
        if not any(n.family == "svm" for n in self.networks):
            return ["PAYWIRE_REFUND_KEY_SOLANA is set but PAYWIRE_NETWORKS has no Solana network: "
                    "refunds are for payments on Solana (unset it, or add solana)"]
        key = self.secret("refund_key_solana")
        problems = _key_problems(key, "PAYWIRE_REFUND_KEY_SOLANA", evm=False)
        if problems:
            return problems
        from solders.keypair import Keypair

        address = str(Keypair.from_base58_string(key).pubkey())
        if self.solana_pay_to and address != self.solana_pay_to:
            problems.append(f"PAYWIRE_REFUND_KEY_SOLANA is the key of {address}, not of "
                            f"PAYWIRE_SOLANA_PAY_TO ({self.solana_pay_to}): refunds are sent from "
                            "the wallet payments are paid to; set that wallet's key")
        if self.refunds_on and not self.solana_rpc_url:
            problems.append("PAYWIRE_SOLANA_RPC_URL is not set: refunds are sent through a Solana "
                            "node (or set PAYWIRE_REFUNDS=false)")
        return problems


_FIELD_OF = {_info.validation_alias: _name for _name, _info in Settings.model_fields.items()}


class PayerSettings(_FromEnvironment):
    """What `paywire pay` (the client) reads; the gateway's settings are not needed to pay."""

    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, extra="ignore")

    payer_key: SecretStr | None = _key(
        "PAYWIRE_PAYER_KEY", "`paywire pay`, `paywire mcp`: the payer's key (an EVM private key "
        "0x... or a Solana base58 secret key); default: the devnet demo payer")
    solana_rpc_url: str | None = _url(
        "PAYWIRE_SOLANA_RPC_URL", "`paywire pay`, `paywire mcp`: the Solana node a payment is built with")
    data_dir: Path = _var("PAYWIRE_DATA_DIR", Path(".paywire"),
                          "`paywire pay`, `paywire mcp`: where the devnet demo payer's keys are (and "
                          "the spend ledger of `paywire mcp`)", accepts="a folder")
    # `paywire mcp` (agent/mcp/proxy.py): the paying stdio MCP proxy and its spend caps
    mcp_server_url: str | None = _url(
        "PAYWIRE_MCP_SERVER_URL", "`paywire mcp`: the remote MCP server (streamable HTTP) whose tools "
        "it offers and pays for, e.g. https://gateway.example/mcp")
    mcp_network: str | None = _var(
        "PAYWIRE_MCP_NETWORK", None, "`paywire mcp`: pay on this network only: evm, solana, or a "
        "network id such as eip155:84532 (default: the first offered that the key can pay)",
        accepts="evm, solana, or a network id such as eip155:8453 or base")
    mcp_max_per_call: Decimal = _var(
        "PAYWIRE_MCP_MAX_PER_CALL", Decimal("0.10"), "`paywire mcp`: the most USD one tool call may "
        "cost; a dearer call is refused before anything is signed", accepts="a USD amount")
    mcp_max_per_day: Decimal = _var(
        "PAYWIRE_MCP_MAX_PER_DAY", Decimal("1.00"), "`paywire mcp`: the most USD signed per UTC day "
        "(every payment not proven unspent counts); a call past it is refused before anything is "
        "signed", accepts="a USD amount")
    mcp_ledger: Path | None = _var(
        "PAYWIRE_MCP_LEDGER", None, "`paywire mcp`: the spend ledger, a SQLite file (default: "
        "mcp-spend.db in PAYWIRE_DATA_DIR)", accepts="a file path")

    @field_validator("mcp_server_url", "solana_rpc_url")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        problem = _url_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("mcp_network")
    @classmethod
    def _a_network(cls, value: str | None) -> str | None:
        if value is None or value in ("evm", "solana"):
            return value
        try:
            lookup_network(value)
        except ValueError as exc:
            raise ValueError(f"must be evm, solana, or a network id: {exc}") from None
        return value

    @field_validator("mcp_max_per_call", "mcp_max_per_day", mode="before")
    @classmethod
    def _a_cap(cls, value: Any) -> Decimal:
        from payments.spend_caps import parse_cap

        return parse_cap(str(value))  # CapError (a ValueError) says what a cap may be

    @property
    def mcp_ledger_path(self) -> Path:
        return self.mcp_ledger or self.data_dir / "mcp-spend.db"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PayerSettings:
        token = _SOURCE.set(cls._source(env))
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigError.of(_problems(exc, cls)) from None
        finally:
            _SOURCE.reset(token)


# ---------------------------------------------------------------------------------------------
# Messages

def _alias(info: FieldInfo) -> str:
    return str(info.validation_alias)


def _extra(info: FieldInfo) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _problems(exc: ValidationError, model: type[BaseSettings] = Settings) -> list[str]:
    """Each validation error as one sentence naming the variable and what it accepts; a secret's
    value is never repeated."""
    fields = {_alias(info): info for info in model.model_fields.values()}
    out: list[str] = []
    for error in exc.errors(include_url=False):
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _Problems):
            out += cause.problems
            continue
        loc = error.get("loc") or ()
        variable = str(loc[0]) if loc else ""
        info = fields.get(variable)
        if info is None:
            out.append(f"{variable}: {error['msg']}" if variable else str(error["msg"]))
            continue
        if isinstance(cause, ValueError):  # our own check: says what is wrong and what would do
            out.append(f"{variable} {cause}")
            continue
        accepts = _extra(info).get("accepts") or "a valid value"
        got = "" if _extra(info).get("secret") else f", got {error.get('input')!r}"
        out.append(f"{variable} must be {accepts}{got}")
    return out


def _default_text(info: FieldInfo) -> str:
    value = info.default
    if value is None or value == "" or value == () or value == frozenset():
        return "-"
    return str(value)


def _shown(name: str, value: Any, info: FieldInfo) -> str:
    if isinstance(value, SecretStr):
        return "********" if value.get_secret_value() else ""
    if value is None:
        return ""
    if name == "networks":
        return ",".join(n.v1_name for n in value) or "devnet"
    if name == "database_url" and value:
        from sqlalchemy.engine import make_url

        return make_url(value).render_as_string(hide_password=True)
    if name == "trusted_proxies":
        return ",".join(value)
    if isinstance(value, tuple):
        return os.pathsep.join(str(v) for v in value)
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    return str(value)


def looks_secret(variable: str) -> bool:
    """A variable whose value is masked when shown (keys, tokens, secrets, passwords)."""
    return any(word in variable for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))


def _address_problems(value: str, var: str, *, evm: bool) -> list[str]:
    if not value:
        return [f"{var} is not set: the address that receives payments on that network"]
    if evm:
        from eth_utils import is_address

        if not is_address(value):
            return [f"{var} is not an EVM address (0x + 40 hex digits): {value!r}"]
        return []
    from solders.pubkey import Pubkey

    try:
        Pubkey.from_string(value)
    except ValueError:
        return [f"{var} is not a base58 Solana address: {value!r}"]
    return []


def _key_problems(value: str, var: str, *, evm: bool) -> list[str]:
    """A facilitator key that cannot sign (its value is never repeated)."""
    if evm:
        return [] if _EVM_KEY.match(value) else [
            f"{var} is not an EVM private key (0x + 64 hex digits)"]
    from solders.keypair import Keypair

    try:
        Keypair.from_base58_string(value)
    except ValueError:
        return [f"{var} is not a Solana secret key (base58 of the 64-byte keypair)"]
    return []

