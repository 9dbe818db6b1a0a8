"""Stopping a replica whose background loop loses its cancellation.

Python 3.11's ``asyncio.wait_for``, which nats-py's requests use, returns the inner result and
drops the cancellation when both arrive in the same event-loop step. A loop that retries in
``while True`` then simply goes on, and a stop that cancelled it once would wait for it forever
(seen as a replica that never finished stopping, about once in a hundred stops, when five
replicas started and stopped together on one server).
"""

from __future__ import annotations

import asyncio

from harness import wait_for_async
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.engine.ports import MemberRecord, NullObserver
from hrwcron.engine.scheduler import Scheduler, Settings

SETTINGS = Settings(
    node_id="solo",
    heartbeat_interval=0.1,
    member_ttl=0.8,
    membership_refresh=0.1,
    shutdown_timeout=1.0,
)


class CancelLosingMembers(MemoryMembers):
    """Once ``lose`` is set, the next membership read waits until cancelled and then returns
    as if its answer had arrived in that same step: that one cancellation is gone."""

    def __init__(self, ttl: float) -> None:
        super().__init__(ttl)
        self.lose = False
        self.reads_in_progress = 0

    async def snapshot(self) -> dict[str, MemberRecord]:
        if self.lose:
            self.lose = False
            self.reads_in_progress += 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass
            finally:
                self.reads_in_progress -= 1
        return await super().snapshot()


async def test_stop_finishes_when_a_loop_loses_its_cancellation() -> None:
    members = CancelLosingMembers(SETTINGS.member_ttl)
    scheduler = Scheduler(
        SETTINGS,
        members=members,
        claims=MemoryClaims(),
        triggers=MemoryTriggers(600.0),
        jobs=MemoryJobs(),
        observer=NullObserver(),
    )
    await scheduler.start()
    members.lose = True
    await wait_for_async(
        lambda: members.reads_in_progress > 0, timeout=10, message="a membership read pending"
    )
    # Bounded here only so that a regression fails instead of hanging the suite.
    await asyncio.wait_for(scheduler.stop(), timeout=30)
    assert all(task.done() for task in scheduler._tasks)
