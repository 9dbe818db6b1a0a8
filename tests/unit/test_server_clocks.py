"""What "never early" means when the NATS servers disagree about the time.

Replicas take the time from the server timestamps of their own heartbeats, that is from the
clock of whichever server leads the members bucket; a trigger is stamped by whichever server
leads the trigger stream. Here the two are the in-memory stores on virtual time: the members
store's clock is set off true time, the trigger store keeps true time, as when one server's
clock is off and it leads the members bucket while another leads the triggers.

* off by less than ``max_clock_skew``: the replicas follow the members server, so triggers are
  never early by its clock, and early or late by the offset on the trigger server's clock;
* off by more: the replicas' own clocks disagree with their time source by more than they
  may, every one reports not ready and fires nothing (fail closed) until it is set right.

(On real servers this cannot be staged: nats-server is a statically linked Go binary that
reads the clock through the vDSO, which libfaketime, a preload library, never reaches.)
"""

from __future__ import annotations

import time

import msgspec
import pytest

from harness import wait_for_async
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import NullObserver
from hrwcron.engine.scheduler import Scheduler, Settings

SETTINGS = Settings(
    node_id="solo",
    heartbeat_interval=0.2,
    member_ttl=0.8,
    membership_refresh=0.2,
    failover_step=0.4,
    claim_lease=0.5,
    max_clock_skew=1.0,
    shutdown_timeout=1.0,
)
JOBS = [JobSpec(name=f"j{i}", schedule="@every 1s") for i in range(3)]


async def run_with_members_clock(offset_ms: float, seconds: float) -> tuple[str, list[float]]:
    """One replica for ``seconds`` whose members store's clock is ``offset_ms`` off; returns
    why it was not ready at the end (empty: it was) and, per trigger, the trigger store's
    timestamp minus the due instant."""
    members = MemoryMembers(
        SETTINGS.member_ttl, server_clock=lambda: time.time() * 1000 + offset_ms
    )
    triggers = MemoryTriggers(600.0)
    jobs = MemoryJobs()
    for job in JOBS:
        await jobs.put(job, None)
    replica = Scheduler(
        SETTINGS,
        members=members,
        claims=MemoryClaims(),
        triggers=triggers,
        jobs=jobs,
        observer=NullObserver(),
    )
    await replica.start()
    try:
        end = time.time() + seconds
        await wait_for_async(lambda: time.time() >= end, timeout=seconds + 5, interval=0.1)
        reason = replica.not_ready_reason
    finally:
        await replica.stop()
    lateness = [m.stored_ms - msgspec.json.decode(m.body)["due_ms"] for m in triggers.messages]
    return reason, lateness


@pytest.mark.parametrize("offset_ms", [600.0, -600.0])
async def test_within_max_clock_skew_ticks_follow_the_members_server(offset_ms: float) -> None:
    reason, lateness = await run_with_members_clock(offset_ms, 8.0)
    assert reason == ""
    assert len(lateness) >= 15
    # Never early by the members server's clock: stored (true time) + offset >= due.
    assert min(lateness) + offset_ms >= -5, sorted(lateness)[:5]
    # And so, on the trigger server's own clock, early (or late) by the offset, no more.
    shifted = [late + offset_ms for late in lateness]
    assert max(shifted) < 100, sorted(shifted)[-5:]
    if offset_ms > 0:
        assert min(lateness) < -offset_ms / 2, "a members clock ahead makes ticks early"


async def test_beyond_max_clock_skew_every_replica_fails_closed() -> None:
    reason, lateness = await run_with_members_clock(5_000.0, 6.0)
    assert lateness == []
    assert reason.startswith("clock is 5000 ms off"), reason
