"""The networks paywire takes payments on: CAIP-2 ids, v1 names, USDC assets.

Facts checked against the x402 specs and SDK 2.25 (see docs/architecture.md). Devnet ids are
the testnets' ids, never mainnet's, so a devnet signature is worthless on a real chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["evm", "svm"]


@dataclass(frozen=True)
class NetworkInfo:
    caip2: str
    v1_name: str
    family: Family
    usdc: str
    decimals: int = 6
    label: str = ""


BASE = NetworkInfo(
    "eip155:8453", "base", "evm", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", label="Base"
)
BASE_SEPOLIA = NetworkInfo(
    "eip155:84532",
    "base-sepolia",
    "evm",
    "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
    label="Base Sepolia",
)
SOLANA = NetworkInfo(
    "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
    "solana",
    "svm",
    "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
    label="Solana",
)
SOLANA_DEVNET = NetworkInfo(
    "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1",
    "solana-devnet",
    "svm",
    "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU",
    label="Solana devnet",
)

KNOWN_NETWORKS: tuple[NetworkInfo, ...] = (BASE, BASE_SEPOLIA, SOLANA, SOLANA_DEVNET)
_BY_ANY_NAME = {n.caip2: n for n in KNOWN_NETWORKS} | {n.v1_name: n for n in KNOWN_NETWORKS}


def lookup_network(name: str) -> NetworkInfo:
    """Find a network by CAIP-2 id or v1 name; raises ValueError listing what is accepted."""
    try:
        return _BY_ANY_NAME[name]
    except KeyError:
        accepted = ", ".join(sorted(_BY_ANY_NAME))
        raise ValueError(f"unknown network {name!r}; accepted: {accepted}") from None
