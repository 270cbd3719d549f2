"""`kill -9` at each crash point (payments/failpoints.py), side by side on one gateway process
on SQLite (restarted by its supervisor, the test, without the failpoint) and on one of two
replicas sharing PostgreSQL (the other replica, and the reconciler, take over); and a replica
killed inside the send lock its replicas share.

Clients retry through the crash: connection refused while a process is down, 409 while a dead
claim's lease runs, 503 settlement_pending while the chain is asked. The invariant is checked for
every payment (harness.check)."""

from __future__ import annotations

import pytest

from .harness import (
    EVM_NET,
    LEASE_SECONDS,
    SOL_NET,
    Client,
    Deployment,
    cut_by_the_kill,
    mixed,
    scenario,
    settled_by_reconciler,
    side_by_side,
)

KILLED = 3  # the failpoint fires on its third hit: two payments went through that process first
BESIDE = 6  # payments paid to the surviving replica meanwhile, 4 at a time

# A dying process is paid one payment at a time, so the third to reach the point is the one that
# dies (the after-intent test pays four at a time: payments in flight beside it die in that window
# too); the replica that dies is paid one payment more than it needs: on a loaded machine the
# claim's lease of its first (cold) call may run out, and the survivor finishes that payment
# without it reaching the point. Where the chain's answer matters the dying payment's chain is
# fixed, the other one on the replicas.
CRASHES = [
    # (point, networks on SQLite, networks of the replica that dies)
    ("after_claim", mixed(6), mixed(5)),
    ("during_run", mixed(6), mixed(5)),
    ("after_broadcast", [SOL_NET] * 5, [EVM_NET] * 4),
    ("after_settle", [EVM_NET] * 5, [SOL_NET] * 4),
]

MOVED = ("after_broadcast", "after_settle")  # crash points where the dying payment moved

# The clients' deadline while a crash lasts, however slow the machine (the payments before the
# failpoint, a restart: up to a minute each on a 2-core machine at load 12); it bounds
# `Gateway.wait_killed` too. Each test's `deadline` counts from the crash's end
# (ClientRun.answer_within): what it bounds is the gateway's recovery.
DURING_CRASH_SECONDS = 180


def one_process(single: Deployment, point: str, networks: list[str], *, concurrency: int = 1,
                deadline: float = 20 + LEASE_SECONDS) -> None:
    gateway = single.gateways[0]
    gateway.restart(failpoints=f"{point}=kill@{KILLED}")
    run = scenario(f"sqlite, 1 process, kill -9 {point}"
                   + (f", {concurrency} in flight" if concurrency > 1 else ""), single, networks)
    client = Client(single.urls, deadline_seconds=DURING_CRASH_SECONDS)
    paying = client.start(run.payments, concurrency=concurrency)
    gateway.wait_killed(paying)
    gateway.start()  # the supervisor brings it back, without the failpoint
    run.quiet()
    paying.answer_within(deadline)
    paying.wait()
    client.replay(run.payments)
    report = run.check()
    assert report.charged == report.delivered == len(networks)
    if point in MOVED:  # the dead process's payment had moved: the chain said so
        assert settled_by_reconciler(single, cut_by_the_kill(run.payments))


def two_replicas(replicas: Deployment, point: str, networks: list[str], *,
                 deadline: float = 20 + LEASE_SECONDS) -> None:
    victim, survivor = replicas.gateways
    if not survivor.alive or survivor.failpoints:
        survivor.restart()
    victim.restart(failpoints=f"{point}=kill@{KILLED}")
    run = scenario(f"postgres, 2 replicas, kill -9 {point} on one", replicas,
                   networks + mixed(BESIDE), via=1)
    to_victim, beside = run.payments[:len(networks)], run.payments[len(networks):]
    client = Client(replicas.urls, deadline_seconds=DURING_CRASH_SECONDS)
    one_at_a_time = client.start(to_victim, concurrency=1, first=0)
    meanwhile = Client([survivor.url], deadline_seconds=DURING_CRASH_SECONDS).start(beside,
                                                                                 concurrency=4)
    victim.wait_killed(one_at_a_time)
    run.quiet()
    for paying in (one_at_a_time, meanwhile):
        paying.answer_within(deadline)
    one_at_a_time.wait()
    meanwhile.wait()
    client.replay(run.payments)
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)
    if point in MOVED:
        assert settled_by_reconciler(replicas, cut_by_the_kill(to_victim))


@pytest.mark.parametrize(("point", "on_sqlite", "on_replica"), CRASHES, ids=[c[0] for c in CRASHES])
def test_kill_9(single: Deployment, replicas: Deployment, point: str, on_sqlite: list[str],
                on_replica: list[str]) -> None:
    side_by_side(lambda: one_process(single, point, on_sqlite),
                 lambda: two_replicas(replicas, point, on_replica))


def test_kill_9_of_a_replica_holding_the_send_lock(replicas: Deployment) -> None:
    """A replica dies inside the send lock (PostgreSQL advisory lock on the shared EVM key) after
    the node took its transaction and before the node's answer came back: PostgreSQL drops the
    dead session's lock, so the survivor's EVM settlements go on (no nonce reused); the dead
    replica's payment, which moved, is found on chain and delivered to the retrying payer."""
    replicas.ensure_running()
    victim, survivor = replicas.gateways
    gate = replicas.gate
    assert gate is not None
    run = scenario("postgres, 2 replicas, kill -9 holding the send lock", replicas,
                   [EVM_NET] + [EVM_NET, SOL_NET] * 3, via=1)
    dying, beside = run.payments[:1], run.payments[1:]
    gate.hold("eth_sendRawTransaction", forward_first=True)
    try:
        paying = Client(replicas.urls, deadline_seconds=DURING_CRASH_SECONDS).start(
            dying, concurrency=1, first=0)
        assert gate.held.wait(30), "the settlement did not reach the node"
        meanwhile = Client([survivor.url], deadline_seconds=DURING_CRASH_SECONDS).start(
            beside, concurrency=4)
        victim.kill()
        run.quiet()
        for clients in (paying, meanwhile):
            clients.answer_within(20)
    finally:
        gate.release()
    paying.wait()
    meanwhile.wait()
    Client(replicas.urls).replay(run.payments)
    report = run.check()
    assert report.charged == report.delivered == len(run.payments)
    assert settled_by_reconciler(replicas, dying[0])


def test_kill_9_after_the_intent(single: Deployment, replicas: Deployment) -> None:
    """Nothing was broadcast: the reconciler finds the authorization unused and still valid, and
    the payer's retry of the same payment settles it again (once), within seconds of the crash's
    end. On SQLite three more are in flight beside the dying one."""
    side_by_side(
        lambda: one_process(single, "after_intent", [EVM_NET] * 7, concurrency=4, deadline=9),
        lambda: two_replicas(replicas, "after_intent", [SOL_NET] * (KILLED + 1), deadline=7))
