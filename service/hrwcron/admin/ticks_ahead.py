"""The ticks the jobs this replica holds will fire in a stretch ahead, counted per first-ranked
member and per bucket of time: the status document's timeline and the console's fleet page
both read it.

The work is bounded by ticks counted and by search steps spent (``Allowance``), not by what
the stretch holds, and yields to the event loop in time slices; past either bound the count
says it is partial. A job whose first unresolved tick is already past the stretch costs one
comparison, which is what most jobs cost at 100,000 with a one-hour stretch.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from hrwcron.core.errors import SearchExhausted
from hrwcron.core.plan import Allowance
from hrwcron.engine.pacing import Slices
from hrwcron.engine.queries import EngineQueries

__all__ = ["TicksAhead", "count_ticks_ahead"]


@dataclass
class TicksAhead:
    start_ms: int  # the first bucket's start: ``now`` rounded down to a bucket
    bucket_ms: int
    per_member: dict[str, list[int]]  # first-ranked member: ticks per bucket
    seconds: collections.Counter[int] = field(default_factory=collections.Counter)
    partial: bool = False


async def count_ticks_ahead(
    s: EngineQueries,
    members: Iterable[str],
    now_ms: int,
    *,
    span_ms: int,
    bucket_ms: int,
    tick_budget: int,
    search_budget: int,
) -> TicksAhead:
    """The fires from ``now_ms`` rounded down to a bucket until ``now_ms + span_ms``, each
    counted in its bucket under the member ranked first for its job (rows for ``members``
    even when empty) and in its second, for the heaviest seconds."""
    start = now_ms // bucket_ms * bucket_ms
    end = now_ms + span_ms
    buckets = -(-(end - start) // bucket_ms)
    ahead = TicksAhead(start, bucket_ms, {node: [0] * buckets for node in members})
    allowance = Allowance(search_budget)
    slices = Slices()
    counted = 0
    for name, job in list(s.jobs.items()):
        if slices.spent():
            await asyncio.sleep(0)
        if job.spec.paused or name not in s.jobs:
            continue
        due = s.due_of(name)
        if due is None or due + job.jitter_ms > end:
            continue
        order = s.ranking_of(name)
        if not order:
            continue
        row = ahead.per_member.setdefault(order[0], [0] * buckets)
        left = s.progress(name, allowance).runs_left if job.spec.max_runs else None
        firing = job.plan.iter_firing(due - 1, until=end - job.jitter_ms, allowance=allowance)
        try:
            for count, tick in enumerate(firing):
                if left is not None and count >= left:
                    break
                fire = tick + job.jitter_ms
                if fire >= start:
                    row[(fire - start) // bucket_ms] += 1
                    ahead.seconds[fire // 1000] += 1
                    counted += 1
                if counted >= tick_budget:
                    ahead.partial = True
                    break
                if slices.spent():
                    await asyncio.sleep(0)
        except SearchExhausted:
            ahead.partial = True
        if counted >= tick_budget:
            break
    ahead.per_member = dict(sorted(ahead.per_member.items()))
    return ahead
