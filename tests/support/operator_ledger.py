"""What the operator tests watch: a live gateway with the operator API on, real paid calls on its
devnet, and the two rows an operator must notice, written through the Ledger's own methods: a
call that failed after its upstream billed (released, with an unbilled cost) and a settlement
whose outcome is not known (pending, with its transaction). And channels (x402 batch-settlement),
written through the ChannelStore's own writes (adopt, reserve, commit, mirror) with vouchers the
SDK's client signs: deposits, charges, claims, a withdrawal."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import PAYLOAD_TYPE_VOUCHER
from x402.mechanisms.evm.signers import EthAccountSigner

from agent.app import make_engine
from payments.channels.store import ChannelCall, ChannelStore, Committed, Reserved
from payments.channels.wire import ChannelConfig, Onchain, Voucher, channel_id_of
from payments.ledger import ClaimRequest, Ledger, PaymentKey
from payments.networks import BASE_SEPOLIA
from tests.support.live_server import LiveServer, start_server
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

SKILL = "token-count-508"
BODY = {"text": "what the operator watches", "model": "gpt-4o"}
FAILED_SKILL = "image-menu-failed"  # shown as it is: a skill id of the ledger row
FAILURE = "upstream answered 502 after billing <script>alert(1)</script>"  # text, never markup
PENDING_TX = "0x" + "ab" * 32


def admin_token() -> str:
    """A fresh operator token for one server (never a fixed secret in the tree)."""
    return secrets.token_hex(24)  # 48 characters


def start_admin_server(data_dir: Path, token: str) -> LiveServer:
    return start_server(data_dir, env={"PAYWIRE_ADMIN_TOKEN": token})


def pay_calls(live: LiveServer, count: int) -> list[str]:
    """`count` paid calls of SKILL on EVM; their transactions."""
    url = f"{live.url}/v1/marketplace/api/{SKILL}"
    client = client_for(live.url, evm_key=live.devnet.keys.evm_payer)
    transactions = []
    for _ in range(count):
        _, required = quote(url, BODY)
        paid = post_paid(url, BODY, header(sign(client, required, EVM_NET)))
        assert paid.status_code == 200, paid.text
        transactions.append(receipt(paid)["transaction"])
    return transactions


@dataclass(frozen=True)
class Watched:
    failed_row: str
    pending_row: str


async def _failure_and_pending(db_url: str) -> Watched:
    engine = make_engine(db_url)
    ledger = Ledger(engine)
    try:
        failed = await ledger.claim(ClaimRequest(
            PaymentKey(EVM_NET, "0x" + "21" * 20, "0x" + "01" * 32), 12_000, "0xasset", "0xpay",
            FAILED_SKILL, "d"), owner="operator-test", lease_seconds=60)
        assert await ledger.release(failed.row_id, FAILURE,  # type: ignore[union-attr]
                                    upstream_cost_usd=Decimal("0.0042"))
        waiting = await ledger.claim(ClaimRequest(
            PaymentKey(EVM_NET, "0x" + "22" * 20, "0x" + "02" * 32), 5_750, "0xasset", "0xpay",
            SKILL, "d"), owner="operator-test", lease_seconds=3600)
        row = waiting.row_id  # type: ignore[union-attr]
        assert await ledger.begin_settlement(row, owner="operator-test", chain_ref={"kind": "test"},
                                             lease_seconds=3600)
        assert await ledger.mark_pending(row, "facilitator timed out", tx_hash=PENDING_TX,
                                         retry_in_seconds=3600)
        return Watched(failed.row_id, row)  # type: ignore[union-attr]
    finally:
        ledger.close()
        await engine.dispose()


def add_failure_and_pending(live: LiveServer) -> Watched:
    """The released and pending rows, in the live server's database (its own engine and loop)."""
    return asyncio.run(_failure_and_pending(live.runtime.settings.db_url))


# -- channels --------------------------------------------------------------------------------------

CHANNEL_TOKEN = BASE_SEPOLIA.usdc.lower()
CHANNEL_RECEIVER = "0x" + "12" * 20
CHANNEL_AUTHORIZER = "0x" + "34" * 20


@dataclass(frozen=True)
class ChannelPayer:
    """A payer with one channel, signing its vouchers with the SDK's own client signer."""

    account: LocalAccount
    config: ChannelConfig
    network: str

    @staticmethod
    def new(salt: int = 0, *, network: str = EVM_NET, token: str = CHANNEL_TOKEN) -> ChannelPayer:
        account = Account.create()
        address = account.address.lower()
        return ChannelPayer(account, ChannelConfig(
            address, address, CHANNEL_RECEIVER, CHANNEL_AUTHORIZER, token, 3600,
            "0x" + salt.to_bytes(32, "big").hex()), network)

    @property
    def channel_id(self) -> str:
        return channel_id_of(self.config, int(self.network.split(":")[1]))

    def call(self, base: int, price: int) -> ChannelCall:
        """A call priced `price`, its voucher signed on top of the running total `base`."""
        signed = sign_voucher(EthAccountSigner(self.account), self.channel_id, base + price,
                              self.network)
        voucher = Voucher(signed.channel_id.lower(), int(signed.max_claimable_amount),
                          signed.signature)
        return ChannelCall(self.network, PAYLOAD_TYPE_VOUCHER, self.config, voucher, price,
                           self.config.token, CHANNEL_RECEIVER, SKILL, uuid.uuid4().hex)


async def open_channel(store: ChannelStore, payer: ChannelPayer, balance: int,
                       total_claimed: int = 0) -> None:
    """The channel's row as a deposit (or none: balance 0) leaves it, read from the chain."""
    await store.adopt(payer.config, channel_id=payer.channel_id, network=payer.network,
                      onchain=Onchain(balance, total_claimed))


async def charge_calls(store: ChannelStore, payer: ChannelPayer, charges: Sequence[int],
                       owner: str = "operator-test") -> int:
    """One delivered call per charge (priced at it), each reserved then committed as the
    pipeline does; the channel's running total after them."""
    channel = await store.get(payer.channel_id)
    assert channel is not None
    total = channel.charged
    for charge in charges:
        call = payer.call(total, charge)
        reserved = await store.reserve(call, owner=owner, lease_seconds=60)
        assert isinstance(reserved, Reserved), reserved
        committed = await store.commit(reserved.row_id, call, owner=owner, actual=charge)
        assert isinstance(committed, Committed), committed
        total += charge
    return total


@dataclass(frozen=True)
class ChannelsWritten:
    """The channels `add_channels` wrote: ids, and what they hold (atomic units)."""

    busy: str  # open: 4 calls of 5,750 charged, one claimed
    leaving: str  # closing: its payer asked to withdraw, one call unclaimed
    empty: str  # closed: no deposit
    balance: int = 1_000_000 + 50_000
    charged: int = 5 * 5_750
    claimed: int = 5_750

    @property
    def unclaimed(self) -> int:
        return self.charged - self.claimed

    @property
    def escrow(self) -> int:
        return self.balance - self.charged


async def write_channels(db_url: str) -> ChannelsWritten:
    """Three channels on one network and token, in the database of `db_url` (schema current)."""
    engine = make_engine(db_url)
    ledger = Ledger(engine)
    store = ChannelStore(ledger, claim_threshold_atomic=1_000_000, claim_interval_seconds=300)
    try:
        busy, leaving, empty = ChannelPayer.new(1), ChannelPayer.new(2), ChannelPayer.new(3)
        await open_channel(store, busy, 1_000_000)
        await charge_calls(store, busy, [5_750] * 4)
        await store.mirror(busy.channel_id, Onchain(1_000_000, 5_750))  # a claim moved one
        await open_channel(store, leaving, 50_000)
        await charge_calls(store, leaving, [5_750])
        await store.mirror(leaving.channel_id, Onchain(50_000, 0, withdraw_requested_at=1_700_000_000))
        await open_channel(store, empty, 0)
        return ChannelsWritten(busy.channel_id, leaving.channel_id, empty.channel_id)
    finally:
        ledger.close()
        await engine.dispose()


def add_channels(live: LiveServer) -> ChannelsWritten:
    """Three channels in the live server's database (its calls count as revenue too)."""
    return asyncio.run(write_channels(live.runtime.settings.db_url))
