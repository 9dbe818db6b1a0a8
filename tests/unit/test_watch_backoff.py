"""A jobs watch that keeps failing is started again at growing intervals (a server that times
out watches is busy, and each start reads the lanes again), and at the first interval again
once one got through. In virtual time: the intervals are exact."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Collection, Coroutine
from typing import Any

from harness import wait_for_async
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.engine.clock import Clock
from hrwcron.engine.jobs import WATCH_BACKOFF_S, Job, JobTable
from hrwcron.engine.ports import Covered, JobEvent, NullObserver
from hrwcron.engine.settings import Settings


class NoHooks:
    """The engine's side of the table; nothing is loaded here."""

    def prepare(self, job: Job) -> None: ...
    def loaded(self, job: Job, *, created: bool = False) -> None: ...
    def runs_unknown(self, name: str) -> None: ...
    def removed(self, job: Job) -> None: ...


class FlakyWatches(MemoryJobs):
    """Every watch fails before delivering anything; those numbered in ``good`` first deliver
    the (empty) job list."""

    def __init__(self, good: Collection[int] = ()) -> None:
        super().__init__()
        self.started: list[float] = []
        self._good = set(good)

    async def watch(
        self, lanes: Collection[str] | None = None
    ) -> AsyncIterator[JobEvent | Covered | None]:
        self.started.append(time.monotonic())
        if len(self.started) - 1 in self._good:
            yield None  # the whole (empty) job list: this one got through
        raise TimeoutError("nats: timeout")


def table(store: MemoryJobs) -> JobTable:
    def spawn(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.ensure_future(work)

    return JobTable(
        Settings(node_id="a", heartbeat_interval=1.0),
        store,
        observer=NullObserver(),
        clock=Clock(),
        last={},
        hooks=NoHooks(),
        spawn=spawn,
    )


def gaps(started: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(started)]


async def test_restarts_of_a_failing_watch_back_off_to_a_bound() -> None:
    store = FlakyWatches()
    jobs = table(store)
    jobs.start_watch()
    await wait_for_async(lambda: len(store.started) >= 9, timeout=300)
    jobs.stopping = True
    assert gaps(store.started)[:8] == [1, 2, 4, 8, 16, 16, 16, 16]
    assert WATCH_BACKOFF_S == 16


async def test_a_watch_that_got_through_starts_again_at_the_first_interval() -> None:
    store = FlakyWatches(good={3})
    jobs = table(store)
    jobs.start_watch()
    await wait_for_async(lambda: len(store.started) >= 6, timeout=300)
    jobs.stopping = True
    # The fourth got through, then failed: its restart waits the first interval again.
    assert gaps(store.started)[:5] == [1, 2, 4, 1, 2]
