"""Why a job's next ticks are when they are: the instants its plan gives, each either firing or
excluded (with the rule, and the stretch it covers), and what ends the list.

``hrwcron next --explain`` prints this and the console's job page shows it, so both say the
same. The walk is bounded like every search over a schedule: a step per instant listed and
:data:`SEARCH_BUDGET` steps for the stretches between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hrwcron.core.plan import SEARCH_BUDGET, SEARCH_HORIZON_MS, TickPlan
from hrwcron.core.ticks import format_ms


@dataclass(frozen=True, slots=True)
class Instant:
    """One due instant of the plan: it fires, or ``rule`` excludes it (and, when the schedule
    has more ticks inside the excluded stretch, every one before ``until``)."""

    due: int
    rule: str | None = None
    until: int | None = None

    @property
    def fires(self) -> bool:
        return self.rule is None


@dataclass(frozen=True, slots=True)
class Explanation:
    instants: tuple[Instant, ...]
    found: int  # instants that fire
    exhausted: bool  # the search bound ran out before it could tell whether more fire
    at: int  # where the walk stopped
    searched: bool  # it stopped on a tick past the horizon, not at the plan's end


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def explain_next(
    plan: TickPlan, after_ms: int, count: int, runs_left: int | None = None
) -> Explanation:
    """The first ``count`` firing instants strictly after ``after_ms`` (fewer when the job has
    ``runs_left``), with the excluded ones met on the way."""
    at = after_ms
    wanted = count if runs_left is None else min(count, runs_left)
    horizon = at + SEARCH_HORIZON_MS
    instants: list[Instant] = []
    found = 0
    due: int | None = None
    for _ in range(wanted + SEARCH_BUDGET):
        due = plan.next_after(at) if found < wanted else None
        if due is None or due > horizon:
            break
        exclusion = plan.excluded_by(due)
        if exclusion is None:
            instants.append(Instant(due))
            found += 1
            at = due
            continue
        # The whole stretch the exclusion covers is one line.
        until = exclusion.covered_until(due)
        more = plan.next_after(due)
        instants.append(Instant(due, exclusion.text, until if more and more < until else None))
        at = max(due, until - 1)
    else:
        return Explanation(tuple(instants), found, True, at, False)
    return Explanation(tuple(instants), found, False, at, due is not None)


def why_fewer(
    plan: TickPlan,
    explanation: Explanation,
    runs_left: int | None,
    fmt: Callable[[int], str] = format_ms,
) -> str:
    """Why the walk found fewer firing instants than asked for (it was not exhausted)."""
    found = explanation.found
    shown = plural(found, "instant")
    if explanation.searched:
        return f"{shown}: the exclusions leave no further tick within the next 100 years"
    if runs_left is not None and found >= runs_left:
        return f"{shown}: the job has {plural(runs_left, 'run')} left"
    if plan.at_ms is not None:
        return f"{shown}: a one-time schedule is due once, at {fmt(plan.at_ms)}"
    if plan.end_ms is not None:
        return f"{shown}: no tick after the end, {fmt(plan.end_ms)}"
    return f"{shown}: the schedule has no further due time"


def exhausted_note(explanation: Explanation, fmt: Callable[[int], str] = format_ms) -> str:
    return (
        f"{plural(explanation.found, 'instant')}: the search stopped after {SEARCH_BUDGET} "
        "excluded stretches without deciding whether a further tick fires (the exclusions are "
        f"too dense); try a later --after than {fmt(explanation.at)}"
    )


def utc_offset(instant_ms: int, tz: str) -> timedelta:
    """The zone's offset from UTC at an instant: where it changes between two ticks, a
    daylight-saving transition lies between them."""
    moment = datetime.fromtimestamp(instant_ms / 1000, UTC).astimezone(ZoneInfo(tz))
    return moment.utcoffset() or timedelta(0)
