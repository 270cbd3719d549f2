"""Devnet keys: generated on first start, kept in the data folder, never committed.

They are worthless by construction (the devnet chains live in this process and use testnet ids),
but they are still keys: the file is written owner-only and nothing logs them.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from eth_account import Account
from solders.keypair import Keypair

KEYS_FILE = "devnet-keys.json"


@dataclass(frozen=True)
class DevnetKeys:
    evm_facilitator: str
    evm_minter: str
    evm_merchant: str
    evm_payer: str
    sol_fee_payer: str  # base58 64-byte secret keys
    sol_mint_authority: str
    sol_merchant: str
    sol_payer: str
    # signs channel claims as the receiverAuthorizer (issue 23 §2); a keys file written before
    # channels existed gains one on its next load
    evm_channel_authorizer: str = ""

    @staticmethod
    def generate() -> DevnetKeys:
        def evm() -> str:
            return "0x" + secrets.token_hex(32)

        def sol() -> str:
            return str(Keypair())

        return DevnetKeys(evm(), evm(), evm(), evm(), sol(), sol(), sol(), sol(), evm())

    @staticmethod
    def evm_address(key: str) -> str:
        return Account.from_key(key).address

    @staticmethod
    def sol_keypair(key: str) -> Keypair:
        return Keypair.from_base58_string(key)

    @property
    def evm_payer_address(self) -> str:
        return self.evm_address(self.evm_payer)

    @property
    def evm_merchant_address(self) -> str:
        return self.evm_address(self.evm_merchant)

    @property
    def sol_payer_address(self) -> str:
        return str(self.sol_keypair(self.sol_payer).pubkey())

    @property
    def sol_merchant_address(self) -> str:
        return str(self.sol_keypair(self.sol_merchant).pubkey())


def load_or_create_keys(data_dir: Path) -> DevnetKeys:
    """The devnet keys of this data folder, generated the first time."""
    path = data_dir / KEYS_FILE
    if path.exists():
        keys = DevnetKeys(**json.loads(path.read_text()))
        if keys.evm_channel_authorizer:
            return keys
        keys = replace(keys, evm_channel_authorizer="0x" + secrets.token_hex(32))
        _write(path, keys, exclusive=False)
        return keys
    data_dir.mkdir(parents=True, exist_ok=True)
    keys = DevnetKeys.generate()
    _write(path, keys, exclusive=True)
    return keys


def _write(path: Path, keys: DevnetKeys, *, exclusive: bool) -> None:
    """The keys file, owner-only (a rewrite goes through a new file renamed over the old)."""
    target = path if exclusive else path.with_name(path.name + ".new")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(keys), fh, indent=2)
    if target != path:
        os.replace(target, path)
