"""What a production `paywire serve` says at startup: the networks, where the money goes, who
settles, the database, the public URL and what is switched on, so an operator reading the log (or
`journalctl -u paywire@8001`) sees the deployment at a glance.

Secrets never appear: keys are shown as the addresses they sign for, the database URL without
its password, node and facilitator URLs without credentials, query or (nodes: providers put API
keys there) path; tokens as set / not set. With JSON logs the same facts are one JSON line on the
`paywire.startup` logger instead of a text block.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agent.settings import Settings

if TYPE_CHECKING:
    from agent.app import Runtime

log = logging.getLogger("paywire.startup")

_BAR = "=" * 78


@dataclass(frozen=True)
class RuntimeFacts:
    """What the assembled gateway sells (the settings alone do not say)."""

    resources: int  # marketplace resources
    models: int  # models in the table
    models_available: int  # those a configured provider can serve


def runtime_facts(runtime: Runtime) -> RuntimeFacts:
    models = runtime.registry.of_kind("model")
    available = sum(1 for m in models if m.info is None or m.info().get("available", True))
    return RuntimeFacts(resources=len(runtime.registry.of_kind("resource")), models=len(models),
                        models_available=available)


def summary(settings: Settings, facts: RuntimeFacts) -> list[tuple[str, str]]:
    """(topic, text) rows of a production gateway's startup summary; no secret in any."""
    rows = [("public URL", _public_url(settings)),
            ("listening", f"{settings.host}:{settings.port}" + (
                f" behind proxies {', '.join(settings.trusted_proxies)} (their X-Forwarded-For/"
                "-Proto are believed)" if settings.trusted_proxies else
                " (X-Forwarded-* ignored: PAYWIRE_TRUSTED_PROXIES is not set)")),
            ("networks", ", ".join(f"{n.v1_name} ({n.caip2})" for n in settings.networks))]
    rows += [("pay to" if i == 0 else "", f"{n.caip2}  {_pay_to(settings, n.family)}")
             for i, n in enumerate(settings.networks)]
    rows += _facilitator(settings)
    rows.append(("database", _database(settings)))
    rows.append(("sold", f"{facts.resources} resources; {facts.models_available} of {facts.models} "
                 f"models available (providers configured: {', '.join(_providers(settings)) or 'none'})"))
    admin = _secret_set(settings, "admin_token")
    rows.append(("admin API", "on at /admin (bearer token)" if admin else
                 "off (set PAYWIRE_ADMIN_TOKEN to serve it)" if admin is not None else "off"))
    metrics = ("off" if not settings.metrics else "on at /metrics, token required"
               if _secret_set(settings, "metrics_token") else
               "on at /metrics, no token: keep it off the internet (deploy/nginx denies it)")
    rows.append(("metrics", metrics))
    rows.append(("rate limits", _limits(settings)))
    rows.append(("logs", "JSON lines" if settings.log_format == "json" else "text"))
    return rows


def production_banner(settings: Settings, facts: RuntimeFacts) -> str:
    """The summary as a text block."""
    rows = summary(settings, facts)
    width = max(len(topic) for topic, _ in rows)
    lines = [_BAR, "  PAYWIRE - production: payments settle on the networks below", _BAR]
    lines += [f"  {topic:<{width}}  {text}" for topic, text in rows]
    lines.append(_BAR)
    return "\n".join(lines)


def announce(settings: Settings, runtime: Runtime) -> None:
    """Print the banner to stderr, or log it as one JSON line when the logs are JSON."""
    facts = runtime_facts(runtime)
    if settings.log_format == "json":
        fields: dict[str, Any] = {}
        key = ""
        for topic, text in summary(settings, facts):  # a row without a topic continues the last
            if topic:
                key = topic.lower().replace(" ", "_")
                fields[key] = text
            else:
                fields[key] += f"; {text}"
        log.info("production settings", extra={"startup": fields})
        return
    print(production_banner(settings, facts), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- parts

def _public_url(settings: Settings) -> str:
    url = settings.base_url
    if not settings.public_url:
        return f"{url} (PAYWIRE_PUBLIC_URL not set: quotes name this address; set the https URL)"
    if urlsplit(url).scheme != "https":
        return f"{url} (not https: clients reach paywire through TLS, set the https URL)"
    return url


def _pay_to(settings: Settings, family: str) -> str:
    return settings.evm_pay_to if family == "evm" else settings.solana_pay_to


def _facilitator(settings: Settings) -> list[tuple[str, str]]:
    if settings.facilitator_urls:
        shown = ", ".join(_bare_url(u, keep_path=True) for u in settings.facilitator_urls)
        order = " (in order of preference)" if len(settings.facilitator_urls) > 1 else ""
        return [("facilitator", f"remote: {shown}{order}")]
    rows = []
    families = {n.family for n in settings.networks}
    if "evm" in families:
        rows.append(f"EVM signer {_evm_address(settings.secret('evm_facilitator_key'))} via "
                    f"{_bare_url(settings.evm_rpc_url or '')}")
    if "svm" in families:
        rows.append(f"Solana fee payer {_solana_address(settings.secret('solana_facilitator_key'))} "
                    f"via {_bare_url(settings.solana_rpc_url or '')}")
    return [("facilitator" if i == 0 else "", ("in process: " if i == 0 else "            ") + text)
            for i, text in enumerate(rows)]


def _evm_address(key: str) -> str:
    from eth_account import Account

    try:
        return str(Account.from_key(key).address)
    except (ValueError, TypeError):  # settings checked it; never echo it anyway
        return "(unreadable key)"


def _solana_address(key: str) -> str:
    from solders.keypair import Keypair

    try:
        return str(Keypair.from_base58_string(key).pubkey())
    except ValueError:
        return "(unreadable key)"


def _bare_url(url: str, *, keep_path: bool = False) -> str:
    """scheme://host[:port] (and the path, when asked): no credentials, no query. A node's URL
    often carries the provider's API key in its path (…/v2/<key>) or query (?api-key=…)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    path = parts.path if keep_path else ("/…" if parts.path.strip("/") else "")
    return f"{parts.scheme}://{host}{port}{path}"


def _database(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(settings.db_url)
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "postgresql":
        return f"{shown} (PostgreSQL: replicas may share it)"
    return f"{shown} (SQLite: this machine only; replicas elsewhere need PostgreSQL)"


def _secret_set(settings: Settings, field: str) -> bool | None:
    """Whether a secret setting is set (None: this paywire has no such setting)."""
    if field not in type(settings).model_fields:
        return None
    return bool(settings.secret(field))


def _providers(settings: Settings) -> list[str]:
    """The model providers whose key is set (a keyless local server: its base URL)."""
    names = [field.removesuffix("_api_key") for field in type(settings).model_fields
             if field.endswith("_api_key") and settings.secret(field)]
    if settings.local_llm_base_url and "local_llm" not in names:
        names.append("local_llm")
    return names


def _limits(settings: Settings) -> str:
    def limit(per_minute: int, burst: int) -> str:
        return f"{per_minute}/min (burst {burst})" if per_minute else "no limit"

    quotes = limit(settings.rate_quotes_per_minute, settings.rate_quotes_burst)
    refused = limit(settings.rate_payments_per_minute, settings.rate_payments_burst)
    return f"per replica and client: quotes {quotes}, refused payments {refused}"
