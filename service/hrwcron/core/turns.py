"""Pure decisions of the engine: who is eligible, in which order, and when each replica acts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hrwcron.core import hrw
from hrwcron.core.plan import TickPlan


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    weight: float
    tags: frozenset[str]


def ranking(job: str, job_tags: Iterable[str], candidates: Iterable[Candidate]) -> list[str]:
    """Eligible candidates for ``job`` in HRW order, owner first; weighted when any weight
    differs from 1 (equal weights give the same order as plain HRW)."""
    needed = frozenset(job_tags)
    eligible = [c for c in candidates if needed <= c.tags]
    if any(c.weight != 1.0 for c in eligible):
        return hrw.weighted_rank(job, {c.node: c.weight for c in eligible})
    return hrw.rank(job, [c.node for c in eligible])


def next_wake(now_ms: float, fire_ms: int, rank: int, step_ms: int) -> int | None:
    """None when the replica at ``rank`` should act now; otherwise when to look again.

    Ranks can only be recomputed at a wake-up, so a replica wakes at every failover step
    boundary until its own turn: if a better-ranked member dies meanwhile it acts one step
    later instead of waiting for its original, later turn."""
    act_at = fire_ms + rank * step_ms
    if now_ms >= act_at:
        return None
    if now_ms < fire_ms:
        return fire_ms
    steps_done = int((now_ms - fire_ms) // step_ms)
    return min(act_at, fire_ms + (steps_done + 1) * step_ms)


def first_due(
    plan: TickPlan,
    *,
    now_ms: float,
    lateness_ms: int,
    last_done_ms: int | None,
    written_ms: float,
) -> int | None:
    """The first tick a replica must still resolve when it starts tracking a job; None when
    the job has no tick left (its window ended, its one-time instant passed).

    Ticks inside the lateness window that are not in the stream yet still count (a restart
    after an outage catches up), but none from before the job's spec was written: adding or
    rescheduling a job never fires an instant from before the change. Excluded ticks that are
    already past were counted by whoever owned them then, so they are passed over silently."""
    start = max(int(now_ms) - lateness_ms, int(written_ms))
    if last_done_ms is not None and last_done_ms >= start:
        start = last_done_ms
    return due_after(plan, start, now_ms)


def due_after(plan: TickPlan, done_ms: int, now_ms: float) -> int | None:
    """The first tick after ``done_ms``, passing over excluded ticks that are already past
    (whoever owned them counted them then); None when the job has no tick left."""
    due = plan.next_after(done_ms)
    while due is not None and due <= now_ms and plan.excluded(due):
        due = plan.next_after(due)
    return due


@dataclass(frozen=True, slots=True)
class Collapsed:
    """What ``catchup = "latest"`` keeps and what it passes over."""

    due: int
    missed: int  # passed-over ticks that would have fired
    excluded: int  # passed-over ticks that were excluded anyway


def collapse_latest(plan: TickPlan, due_ms: int, now_ms: float) -> Collapsed:
    """For ``catchup = "latest"``: the newest tick at or before now starting from ``due_ms``
    (or ``due_ms`` itself when it lies ahead), and the older ones it passes over."""
    missed = excluded = 0
    following = plan.next_after(due_ms)
    while following is not None and following <= now_ms:
        if plan.excluded(due_ms):
            excluded += 1
        else:
            missed += 1
        due_ms, following = following, plan.next_after(following)
    return Collapsed(due_ms, missed, excluded)
