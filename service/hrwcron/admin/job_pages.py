"""What operators see of a replica's job set at any size: a summary that is a few numbers
whatever the number of jobs, and pages of jobs in name or due order.

Shared by the admin API's ``status`` and the HTTP ``/status`` and page. Walking 100,000 jobs
takes tens of milliseconds, so every walk yields to the event loop every few thousand jobs:
the replica's ticks do not wait for an operator's screen.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
from collections.abc import Iterable

from hrwcron.admin.api import StatusSummary
from hrwcron.engine.queries import EngineQueries

# Jobs walked before the event loop gets to run ticks again.
SLICE = 5_000
# Where jobs without a next firing (paused, or out of ticks) sort in due order: last.
NO_DUE = 1 << 62

DueKey = tuple[int, str]


async def summary(scheduler: EngineQueries, *, listed: bool = False) -> StatusSummary:
    """``listed``: of the jobs this replica lists in a status merged from every member's
    share (EngineQueries.lists), so that the members' summaries add up to the whole."""
    paused = failing = count = 0
    for index, job in enumerate(list(scheduler.jobs.values())):
        if not listed or scheduler.lists(job.spec.name):
            count += 1
            paused += job.spec.paused
            failing += bool(job.problem)
        if index % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    counts, counted = (
        (scheduler.listed_owned_counts, scheduler.listed_jobs)
        if listed
        else (scheduler.owned_counts, scheduler.counted_jobs)
    )
    owned = dict(sorted(counts.items()))
    skipped = [name for name in scheduler.skipped if not listed or scheduler.lists(name)]
    return StatusSummary(
        jobs=count,
        paused=paused,
        bad=len(skipped) + failing,
        owned=owned,
        no_owner=counted - sum(owned.values()),
        missed_last_hour=scheduler.missed_recently.total(scheduler.clock.now_ms()),
    )


def add_summaries(summaries: Iterable[StatusSummary]) -> StatusSummary:
    """The whole from the members' summaries of the jobs each lists."""
    total = StatusSummary()
    owned: collections.Counter[str] = collections.Counter()
    for part in summaries:
        total.jobs += part.jobs
        total.paused += part.paused
        total.bad += part.bad
        total.no_owner += part.no_owner
        total.missed_last_hour += part.missed_last_hour
        owned.update(part.owned)
    total.owned = dict(sorted(owned.items()))
    return total


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
    scheduler: EngineQueries, names: Iterable[str], after: DueKey | None, limit: int
) -> list[DueKey]:
    """The first ``limit`` of ``names`` in due order after ``after``: soonest firing first,
    ties by name, jobs that do not fire last."""
    keys: list[DueKey] = []
    for index, name in enumerate(list(names)):
        job = scheduler.jobs.get(name)
        if job is not None:
            key = (fire_of(scheduler.due_of(name), job.jitter_ms, job.spec.paused), name)
            if after is None or key > after:
                keys.append(key)
        if index % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    if limit * 8 < len(keys):
        return heapq.nsmallest(limit, keys)
    keys.sort()
    return keys[:limit]
