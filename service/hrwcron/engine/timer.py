"""One timer heap for every job: wakes when the earliest job is due and hands due jobs over.

Each job has at most one live heap entry (its ``entry`` generation); older entries are dropped
when they reach the top. What to do with a due job is the caller's ``evaluate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from hrwcron.engine.clock import Clock
from hrwcron.engine.jobs import Job

# Due ticks the timer evaluates before it hands them over and lets the loop run.
TIMER_BATCH = 256
# After it has handed over every due tick, the timer sleeps at least this long (ms), so ticks
# spread over a second come in batches of a few ms each instead of one wake-up, one claim
# round and one publish round apiece: on a busy owner the wake-ups and socket writes, not the
# work, are what a spread-out tick costs. It adds at most this much lateness, and none to a
# tick that comes due after a quiet spell.
WAKE_SPACING_MS = 3.0

Act = TypeVar("Act")

# A heap entry: (wake at ms, push sequence, job name, the job's entry generation). A plain
# tuple compares in C, which matters when a top-of-the-minute herd is popped at once.
_Wake = tuple[float, int, str, int]


class Timer(Generic[Act]):
    def __init__(
        self,
        jobs: Mapping[str, Job],
        clock: Clock,
        *,
        ready: Callable[[], bool],
        evaluate: Callable[[Job, float, bool, list[Act]], None],
        submit: Callable[[list[Act]], None],
    ) -> None:
        """``evaluate(job, now, ready, acts)`` decides on a due job, appending what to act on
        to ``acts``; ``submit(acts)`` hands a batch of those over."""
        self._jobs = jobs
        self._clock = clock
        self._ready = ready
        self._evaluate = evaluate
        self._submit = submit
        self.heap: list[_Wake] = []
        self._seq = itertools.count()
        self.wakeup = asyncio.Event()
        self._rest_until = 0.0  # server ms before which the timer does not wake again

    def push(self, job: Job, at_ms: float) -> None:
        """Wake for ``job`` at ``at_ms`` (server ms), replacing its previous entry."""
        job.entry += 1
        heapq.heappush(self.heap, (at_ms, next(self._seq), job.spec.name, job.entry))
        if self.heap[0][0] == at_ms:
            self.wakeup.set()

    async def run(self) -> None:
        heap = self.heap
        jobs = self._jobs
        evaluate = self._evaluate
        while True:
            self.wakeup.clear()
            # Entries left behind (a tick resolved by the feed, a job pushed again) are dropped
            # here rather than waking the loop at their time for nothing: on this kind of
            # machine the wake-up, not the work, is what a spread-out tick costs most.
            while heap:
                _, _, name, entry = heap[0]
                job = jobs.get(name)
                if job is not None and job.entry == entry and not job.busy:
                    break
                heapq.heappop(heap)
            delay = 3600.0
            now = self._clock.now_ms()
            if self._rest_until - now > WAKE_SPACING_MS:
                # Server time went back (the members leader's clock was set right after a
                # step ahead): a rest measured on the old time would last as long as the step.
                self._rest_until = 0.0
            if heap:
                delay = (max(heap[0][0], self._rest_until) - now) / 1000
            if delay > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with the event being set, and the loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(delay, 3600.0)):
                        await self.wakeup.wait()
                continue
            now = self._clock.now_ms()
            ready = self._ready()  # once per batch: it reads the clock and every health sign
            popped = 0
            acts: list[Act] = []
            # Bounded batches: the claims of the first due ticks go out while the rest of a
            # top-of-the-minute herd is still being evaluated.
            while heap and heap[0][0] <= now and popped < TIMER_BATCH:
                _, _, name, entry = heapq.heappop(heap)
                job = jobs.get(name)
                if job is not None and job.entry == entry and not job.busy:
                    evaluate(job, now, ready, acts)
                popped += 1
            if acts:
                self._submit(acts)
            if popped < TIMER_BATCH:
                # Everything due was handed over; a herd still being drained is not held up.
                self._rest_until = now + WAKE_SPACING_MS
            await asyncio.sleep(0)  # a herd of due ticks must not starve the event loop
