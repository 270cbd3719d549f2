"""The reconciler's side of channel calls: a verdict on a call's row (released, or a deposit that
moved) carries the channel's part in the same transaction (`ChannelStore.resolution`)."""

from __future__ import annotations

from collections.abc import Callable

from ..chain_probe import JsonRpc, ProbeError
from ..ledger import PaymentRow, Within
from ..ledger_schema import PaymentState
from .chain import read_channel
from .store import ChannelStore


class ChannelResolutions:
    """For the reconciler: what a channel call's verdict writes with it."""

    def __init__(self, store: ChannelStore, rpc_for: Callable[[str], JsonRpc | None]) -> None:
        self._store, self._rpc_for = store, rpc_for

    async def within(self, row: PaymentRow, to: PaymentState) -> Within:
        """A settled deposit's charge needs the channel's balance after it, read here (ProbeError
        when the chain cannot say: the row waits for the next pass)."""
        if to != PaymentState.SETTLED:
            return self._store.resolution(row, to)
        rpc = self._rpc_for(row.network)
        if rpc is None or row.channel_id is None:
            raise ProbeError(f"no RPC to read channel {row.channel_id} on {row.network}")
        return self._store.resolution(row, to, await read_channel(rpc, row.channel_id))
