"""An admin service over a real engine on the in-memory stores, for the unit tests of the
admin API: replies come from the same jobs view a replica serves them from."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.admin.service import AdminService
from hrwcron.engine.ports import NullObserver
from hrwcron.engine.scheduler import Scheduler, Settings

SETTINGS = Settings(node_id="t", heartbeat_interval=0.2, member_ttl=1.0, shutdown_timeout=1.0)


class FakeClient:
    """What the admin service reads of its NATS connection: the server's message limit."""

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload


@contextlib.asynccontextmanager
async def engine(jobs: MemoryJobs) -> AsyncIterator[Scheduler]:
    """A started engine on the memory stores, ``jobs`` loaded."""
    scheduler = Scheduler(
        SETTINGS,
        members=MemoryMembers(SETTINGS.member_ttl),
        claims=MemoryClaims(),
        triggers=MemoryTriggers(),
        jobs=jobs,
        observer=NullObserver(),
    )
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


@contextlib.asynccontextmanager
async def serving(jobs: MemoryJobs, max_payload: int = 1024 * 1024) -> AsyncIterator[AdminService]:
    """A started engine and the admin service on top of it."""
    async with engine(jobs) as scheduler:
        yield AdminService(
            FakeClient(max_payload),  # type: ignore[arg-type]
            scheduler,
            jobs,
            MemoryTriggers(),
            duplicate_window=600.0,
        )
