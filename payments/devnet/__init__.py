"""The local devnet: both chains in this process, a funded demo payer, a faucet.

`paywire serve` with no configuration takes real x402 payments that settle here: an EVM chain
(py-evm, chain id 84532, EIP-3009 USDC at the Base Sepolia USDC address) and a Solana chain
(LiteSVM, real SPL Token program, the devnet USDC mint). Testnet ids only, so a devnet
signature is worthless on any real chain. Chain state lives in memory: a restart starts afresh
(the ledger, in the database, is kept).

The EVM chain needs py-evm and eth-tester, the optional extra `paywire[devnet]` (`make serve`
installs it; a production install does not): without it `Devnet()` raises `DevnetNotInstalled`,
which says how to install it. Nothing here imports them until a Devnet is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..networks import BASE_SEPOLIA, SOLANA_DEVNET, NetworkInfo
from ..processor import PayTo
from .keys import DevnetKeys

DEMO_PAYER_FUNDS = 100_000_000  # 100 USDC, in atomic units
MERCHANT_LAMPORTS = 10_000_000_000  # 10 SOL: the merchant wallet pays its refunds' fees
# The top-level modules of the `devnet` extra (py-evm is imported as `eth`).
_EXTRA_MODULES = frozenset({"eth", "eth_tester"})


class DevnetNotInstalled(RuntimeError):
    """The devnet's EVM chain needs the optional extra `paywire[devnet]`, which is not installed."""


@dataclass
class Balances:
    evm: int
    solana: int


class Devnet:
    """Both devnet chains with the operator (merchant), facilitator and demo payer set up."""

    def __init__(self, keys: DevnetKeys, *, demo_payer_funds: int = DEMO_PAYER_FUNDS,
                 evm: Any | None = None) -> None:
        """`evm` replaces the default EVM chain (tests put Circle's FiatToken there)."""
        from .solana import SolanaDevnet

        self.keys = keys
        self.evm = evm or _evm_devnet_class()(facilitator_key=keys.evm_facilitator,
                                               minter_key=keys.evm_minter)
        self.solana = SolanaDevnet(
            fee_payer=DevnetKeys.sol_keypair(keys.sol_fee_payer),
            mint_authority=DevnetKeys.sol_keypair(keys.sol_mint_authority),
        )
        # The merchant's token account exists from the start, as an operator's would, and SOL
        # for the fees of the refunds its wallet sends (payments/refunds.py).
        self.solana.mint_to(keys.sol_merchant_address, 0)
        self.solana.airdrop(keys.sol_merchant_address, MERCHANT_LAMPORTS)
        if demo_payer_funds:
            self.fund(keys.evm_payer_address, demo_payer_funds, BASE_SEPOLIA)
            self.fund(keys.sol_payer_address, demo_payer_funds, SOLANA_DEVNET)

    @property
    def networks(self) -> list[NetworkInfo]:
        return [BASE_SEPOLIA, SOLANA_DEVNET]

    def pay_to(self) -> list[PayTo]:
        return [
            PayTo(BASE_SEPOLIA, self.keys.evm_merchant_address),
            PayTo(SOLANA_DEVNET, self.keys.sol_merchant_address),
        ]

    def signers(self) -> tuple[Any, Any]:
        return self.evm.facilitator_signer(), self.solana.facilitator_signer()

    def fund(self, address: str, amount: int, network: NetworkInfo) -> str:
        """The faucet: mint test USDC (atomic units) to any address; returns the tx id."""
        if network.family == "evm":
            return self.evm.mint(address, amount)
        self.solana.airdrop(address, 1_000_000_000)
        return self.solana.mint_to(address, amount)

    def fund_gas(self, address: str, wei: int) -> str:
        """The faucet's EVM gas: send `wei` of native ETH to `address`; returns the tx hash.

        Paid by the EVM chain's own faucet account (funded at genesis, never exposed), so a
        gateway's own facilitator key can pay for its settlements. Solana needs no counterpart:
        `fund` airdrops SOL with every call."""
        return self.evm.fund_gas(address, wei)

    def balance(self, address: str, network: NetworkInfo) -> int:
        if network.family == "evm":
            return self.evm.balance_of(address)
        return self.solana.token_balance(address)

    def merchant_balances(self) -> Balances:
        return Balances(
            self.evm.balance_of(self.keys.evm_merchant_address),
            self.solana.token_balance(self.keys.sol_merchant_address),
        )


def check_installed() -> None:
    """Raise DevnetNotInstalled, saying how to install it, unless the `devnet` extra is here."""
    _evm_devnet_class()


def _evm_devnet_class() -> Any:
    try:
        from .evm import EvmDevnet
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        raise DevnetNotInstalled(
            f"the local devnet needs the optional extra paywire[devnet] ({exc.name} is not "
            "installed): run `pip install 'paywire[devnet]'` (or `make serve`), or set "
            "PAYWIRE_NETWORKS to serve real networks"
        ) from exc
    return EvmDevnet
