"""What operators see of a replica's job set at any size: a summary that is a few numbers
whatever the number of jobs, and pages of jobs in name or due order.

Shared by the admin API's ``status`` and the HTTP ``/status`` and page. Walking 100,000 jobs
takes tens of milliseconds, so every walk yields to the event loop every few thousand jobs:
the replica's ticks do not wait for an operator's screen.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Iterable

from hrwcron.admin.api import StatusSummary
from hrwcron.engine.scheduler import Scheduler

# Jobs walked before the event loop gets to run ticks again.
SLICE = 5_000
# Where jobs without a next firing (paused, or out of ticks) sort in due order: last.
NO_DUE = 1 << 62

DueKey = tuple[int, str]


async def summary(scheduler: Scheduler) -> StatusSummary:
    paused = failing = 0
    for index, job in enumerate(list(scheduler.jobs.values())):
        paused += job.spec.paused
        failing += bool(job.problem)
        if index % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    owned = dict(sorted(scheduler.owned_counts.items()))
    return StatusSummary(
        jobs=len(scheduler.jobs),
        paused=paused,
        bad=len(scheduler.skipped) + failing,
        owned=owned,
        no_owner=scheduler.counted_jobs - sum(owned.values()),
        missed_last_hour=scheduler.missed_recently.total(scheduler.clock.now_ms()),
    )


def fire_of(due: int | None, jitter_ms: int, paused: bool) -> int:
    """When a job fires next (its due instant plus jitter), NO_DUE when it does not."""
    return NO_DUE if paused or due is None else due + jitter_ms


def format_due_cursor(key: DueKey) -> str:
    return f"{key[0]}:{key[1]}"


def parse_due_cursor(text: str) -> DueKey | None:
    """The position a due-order page continues after; None for the first page. A job name
    holds no ':', so the first one ends the instant."""
    if not text:
        return None
    instant, colon, name = text.partition(":")
    if not colon or not instant.isdigit():
        raise ValueError(f"{text[:80]!r} is not a cursor of a page in due order")
    return int(instant), name


async def by_due(
    scheduler: Scheduler, names: Iterable[str], after: DueKey | None, limit: int
) -> list[DueKey]:
    """The first ``limit`` of ``names`` in due order after ``after``: soonest firing first,
    ties by name, jobs that do not fire last."""
    keys: list[DueKey] = []
    for index, name in enumerate(list(names)):
        job = scheduler.jobs.get(name)
        if job is not None:
            key = (fire_of(scheduler.due_of(job), job.jitter_ms, job.spec.paused), name)
            if after is None or key > after:
                keys.append(key)
        if index % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    if limit * 8 < len(keys):
        return heapq.nsmallest(limit, keys)
    keys.sort()
    return keys[:limit]
