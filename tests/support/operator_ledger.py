"""What the operator tests watch: a live gateway with the operator API on, real paid calls on its
devnet, and the two rows an operator must notice, written through the Ledger's own methods: a
call that failed after its upstream billed (released, with an unbilled cost) and a settlement
whose outcome is not known (pending, with its transaction)."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from agent.app import make_engine
from payments.ledger import ClaimRequest, Ledger, PaymentKey
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
