"""Which instants of a schedule are ticks: the active window, exclusions and one-time runs.

A :class:`TickPlan` wraps a :class:`~hrwcron.core.schedule.Schedule` and answers the engine's one
question, "the next tick after t", with the job's window applied: no tick before ``start`` or
after ``end`` (both inclusive, RFC 3339 instants). Exclusions do not remove ticks from that
sequence: an excluded tick still comes due, so that its owner can count it (outcome
``excluded``) at its instant and never fire it, late or otherwise. The engine asks
:meth:`TickPlan.excluded` before it acts. What needs only the ticks that fire (``hrwcron
next``, backfill, the status page) searches with :meth:`TickPlan.search`, which steps over
each excluded stretch whole, bounded in steps; a request that searches for many jobs shares
one :class:`Allowance` between them.

Exclusions (parsed by :mod:`hrwcron.core.exclusions`) are read in the job's zone, on local
wall time:

- a cron expression: a tick whose wall time falls on a time it matches, to its resolution
  (the minute for 5 fields, so ``* * 25 12 *`` excludes every tick on December 25; the second
  for 6 fields);
- ``YYYY-MM-DD`` or ``YYYY-MM-DD..YYYY-MM-DD``: whole local days, both ends included;
- ``YYYY-MM-DDTHH:MM[:SS]..YYYY-MM-DDTHH:MM[:SS]``: local wall times from the first
  (included) to the second (excluded).

Both passes of a repeated hour show the same wall times, so an exclusion covers both.

Run limits (``max_runs``) depend on shared state, not on time, and live in the engine.

Pure: no I/O, no clock. Every function that needs "now" takes it as an argument.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from hrwcron.core.errors import Problem, ScheduleError, SearchExhausted
from hrwcron.core.exclusions import DAY_MS, Exclusion, parse_exclusion
from hrwcron.core.schedule import Schedule
from hrwcron.core.schedule.civil import schedule_error
from hrwcron.core.ticks import format_ms

__all__ = [
    "REQUEST_SEARCH_BUDGET",
    "SEARCH_BUDGET",
    "SEARCH_HORIZON_MS",
    "Allowance",
    "Exclusion",
    "Search",
    "TickPlan",
    "lifecycle",
    "parse_exclusion",
    "parse_rfc3339",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# How far ahead a search for the next firing tick looks before it says there is none, and how
# many candidates or covered stretches it may examine on the way. Each exclusion's covered
# stretch is stepped over whole (a run of excluded days is one step, an expression that matches
# every time one step for all time), so a real calendar of exclusions needs a few steps; a spec
# whose answer would take more (exclusions that leave one second a month, say) cannot be decided
# within the bound and is refused when written, and skipped when found in the bucket. A step is
# a few microseconds, so the bound is a few milliseconds of work (bench/searches.py measures the
# worst case over adversarial specs).
SEARCH_HORIZON_MS = 100 * 366 * DAY_MS
SEARCH_BUDGET = 1_000


def parse_rfc3339(text: object, where: str) -> int:
    """An RFC 3339 instant (``2026-03-01T00:00:00Z``, ``...+01:00``) as epoch milliseconds;
    ScheduleError located at ``where`` otherwise."""
    example = "e.g. 2026-03-01T00:00:00Z or 2026-03-01T00:00:00+01:00"
    if not isinstance(text, str):
        raise schedule_error(where, f"must be a string, not {type(text).__name__}")
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise schedule_error(
            where, f"{text[:80]!r} is not an RFC 3339 instant, {example}"
        ) from None
    if "T" not in text.upper():
        raise schedule_error(where, f"{text[:80]!r} has no time of day, {example}")
    if when.tzinfo is None:
        raise schedule_error(
            where, f"{text[:80]!r} has no UTC offset; add 'Z' or an offset such as '+01:00'"
        )
    if not 1800 <= when.year < 9000:
        raise schedule_error(where, f"{text[:80]!r} is outside the supported years 1800-8999")
    return (when - _EPOCH) // timedelta(milliseconds=1)


# --- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Search:
    """The outcome of a bounded search for the next tick that fires: ``due`` is that tick,
    or None when there is none before ``until`` (``complete``) or the budget ran out first;
    ``steps`` is the work it took, for callers that share one budget between searches."""

    due: int | None
    complete: bool
    steps: int = 0


@dataclass(frozen=True)
class TickPlan:
    """A schedule with the job's window and exclusions. Build with :meth:`parse`."""

    schedule: Schedule
    start_ms: int | None = None
    end_ms: int | None = None
    exclusions: tuple[Exclusion, ...] = ()
    identity: tuple[object, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def parse(
        cls,
        expr: str,
        tz: str = "UTC",
        *,
        job: str | None = None,
        start: str | None = None,
        end: str | None = None,
        exclude: Sequence[str] = (),
    ) -> TickPlan:
        """Raises ScheduleError with every problem: the schedule's where it says (``minute``,
        ``tz``, ...), and ``start``, ``end`` or ``exclude[i]`` for the window's."""
        if start is None and end is None and not exclude:
            return _plain(Schedule.parse(expr, tz, job=job))  # most jobs, 100,000 at a load
        problems: list[Problem] = []
        schedule: Schedule | None = None
        try:
            schedule = Schedule.parse(expr, tz, job=job)
        except ScheduleError as exc:
            problems += exc.problems
        start_ms = end_ms = None
        for name, text in (("start", start), ("end", end)):
            if text is None:
                continue
            try:
                value = parse_rfc3339(text, name)
            except ScheduleError as exc:
                problems += exc.problems
                continue
            if name == "start":
                start_ms = value
            else:
                end_ms = value
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            problems.append(
                Problem("end", f"{end} is before start ({start}): no instant is in the window")
            )
        exclusions: list[Exclusion] = []
        zone_ok = not any(p.where == "tz" for p in problems)
        for i, text in enumerate(exclude):
            if not zone_ok:
                break
            try:
                exclusions.append(parse_exclusion(text, tz, job=job, where=f"exclude[{i}]"))
            except ScheduleError as exc:
                problems += exc.problems
        if problems or schedule is None:
            raise ScheduleError(problems)
        if start_ms is None and end_ms is None and not exclusions:
            return _plain(schedule)
        identity = (schedule, start_ms, end_ms, tuple(e.text for e in exclusions))
        return cls(schedule, start_ms, end_ms, tuple(exclusions), identity)

    @property
    def at_ms(self) -> int | None:
        return self.schedule.at_ms

    @property
    def plain(self) -> bool:
        """No window and no exclusions: every tick of the schedule fires."""
        return self.start_ms is None and self.end_ms is None and not self.exclusions

    @property
    def final_ms(self) -> int | None:
        """The instant after which the plan can have no tick: a one-time schedule's instant or
        the window's end; None when the plan goes on (until a run limit ends it)."""
        finals = [t for t in (self.schedule.at_ms, self.end_ms) if t is not None]
        return min(finals) if finals else None

    def next_after(self, instant: int) -> int | None:
        """The first tick strictly after ``instant`` inside the window, excluded or not; None
        when the window has ended (or a one-time schedule is past)."""
        if self.start_ms is not None and instant < self.start_ms - 1:
            instant = self.start_ms - 1
        try:
            due = self.schedule.next_after(instant)
        except ScheduleError as exc:
            if exc.field == "instant":
                raise  # asked about an instant outside the supported years
            return None  # past the last instant the schedule has
        if self.end_ms is not None and due > self.end_ms:
            return None
        return due

    def excluded_by(self, due: int) -> Exclusion | None:
        for exclusion in self.exclusions:
            if exclusion.covers(due):
                return exclusion
        return None

    def excluded(self, due: int) -> bool:
        return bool(self.exclusions) and self.excluded_by(due) is not None

    def search(
        self, instant: int, *, until: int | None = None, budget: int = SEARCH_BUDGET
    ) -> Search:
        """The first tick after ``instant`` that is not excluded, looking no further than
        ``until`` (default: :data:`SEARCH_HORIZON_MS` ahead) and at most ``budget`` steps."""
        limit = instant + SEARCH_HORIZON_MS if until is None else until
        t = instant
        for step in range(1, max(1, budget) + 1):
            due = self.next_after(t)
            if due is None or due > limit:
                return Search(None, True, step)
            exclusion = self.excluded_by(due)
            if exclusion is None:
                return Search(due, True, step)
            t = max(due, exclusion.covered_until(due) - 1)
        return Search(None, False, max(1, budget))

    def iter_firing(
        self, instant: int, *, until: int | None = None, allowance: Allowance | None = None
    ) -> Iterator[int]:
        """Ticks after ``instant`` (and at most ``until``) that fire, excluded ones left out,
        ascending, lazily, every search paid from ``allowance`` (default: one search bound
        for all of them). Ends with the window or at ``until``; raises SearchExhausted when
        the steps run out before it can tell whether another tick fires."""
        shared = allowance or Allowance(SEARCH_BUDGET)
        t = instant
        while True:
            found = shared.search(self, t, until=until)
            if found.due is None:
                if not found.complete:
                    raise SearchExhausted(f"no firing tick found after {format_ms(t)}")
                return
            yield found.due
            t = found.due

    def never_fires_problem(
        self, now_ms: int, allowance: Allowance | None = None
    ) -> Problem | None:
        """Why no tick after ``now_ms`` would ever fire, or None when one will: also a plan
        whose next firing tick the bounded search cannot find (see :data:`SEARCH_BUDGET`).
        For writes that happen now: a config file applied again later is held to
        :meth:`static_problem` only."""
        at = self.schedule.at_ms
        if at is not None and at <= now_ms:
            return Problem(
                "schedule",
                f"@at {format_ms(at)} is not in the future (server time {format_ms(now_ms)}): "
                "a one-time job must be due after it is written",
            )
        if self.end_ms is not None and self.end_ms <= now_ms:
            return Problem(
                "end",
                f"{format_ms(self.end_ms)} has passed (server time {format_ms(now_ms)}): "
                "the job would never fire",
            )
        return self._empty_problem(now_ms, "every remaining tick", allowance)

    def static_problem(self, allowance: Allowance | None = None) -> Problem | None:
        """Why the plan has no tick that fires at all, whatever the time, or None. The answer
        never changes as time passes, so a file that loaded once keeps loading. A request
        that checks many plans shares one ``allowance`` of search steps between them."""
        at = self.schedule.at_ms
        if at is not None:
            if self.start_ms is not None and at < self.start_ms:
                return Problem("start", f"is after the @at instant {format_ms(at)}")
            if self.end_ms is not None and at > self.end_ms:
                return Problem("end", f"is before the @at instant {format_ms(at)}")
            begin = at - 1
        elif self.start_ms is not None:
            begin = self.start_ms - 1
        else:
            begin = 0  # no start: a search from 1970 stands for "some time"
        return self._empty_problem(begin, "every tick", allowance)

    def _empty_problem(self, after: int, which: str, allowance: Allowance | None) -> Problem | None:
        if self.next_after(after) is None:
            if self.end_ms is None:
                return None  # the schedule itself ends (a one-time schedule): not the window's
            return Problem("end", "no instant of the schedule falls between start and end")
        if self.plain:
            return None  # every tick of the schedule fires
        shared = allowance or Allowance(SEARCH_BUDGET)
        found = shared.search(self, after, until=self.end_ms)
        if found.due is not None:
            return None
        if not found.complete and shared.left <= 0 and found.steps < SEARCH_BUDGET:
            return Problem(
                "exclude",
                "could not be checked: this request spent its allowance of search steps on "
                "other jobs' exclusions; send jobs with exclusions in smaller requests",
            )
        if not found.complete:
            return Problem(
                "exclude",
                f"leave so few ticks that {SEARCH_BUDGET} steps of search found none that "
                f"fires after {format_ms(after)}: whether the job ever fires cannot be decided "
                "in bounded work; use fewer, wider exclusions (whole days, a range of days or "
                "local times, a coarser cron field)",
            )
        until = f" up to end ({format_ms(self.end_ms)})" if self.end_ms is not None else ""
        return Problem("exclude", f"removes {which}{until}: the job would never fire")


def lifecycle(
    plan: TickPlan,
    *,
    paused: bool,
    due: int | None,
    now_ms: float,
    runs_left: int | None,
) -> str:
    """A job's state for people: ``paused``; ``waiting`` for its start; ``active``; ``done``
    (its one-time instant passed or its runs are used up) or ``ended`` (its window closed)
    once it has no tick left."""
    if paused:
        return "paused"
    if due is None:
        if plan.at_ms is not None or runs_left == 0:
            return "done"
        return "ended"
    if plan.start_ms is not None and now_ms < plan.start_ms:
        return "waiting"
    return "active"


# Search steps one whole request may spend (a status page of up to 10,000 jobs, a bulk write),
# each of its searches at most SEARCH_BUDGET: each excluded stretch is one step, so a real
# calendar needs a handful per job; a request that spends its allowance shows the rest as
# unknown (or refuses them) rather than holding the replica.
REQUEST_SEARCH_BUDGET = 100_000


class Allowance:
    """Search steps that several searches share (one status request, one timeline): each
    search may take up to what is left, and pays for what it used."""

    __slots__ = ("left",)

    def __init__(self, steps: int = REQUEST_SEARCH_BUDGET) -> None:
        self.left = steps

    def search(
        self,
        plan: TickPlan,
        instant: int,
        *,
        until: int | None = None,
        most: int = SEARCH_BUDGET,
    ) -> Search:
        """``plan.search(instant, until=until)`` on at most ``most`` of the steps left;
        nothing found, and ``complete`` False, once the allowance is spent."""
        if self.left <= 0:
            return Search(None, False)
        found = plan.search(instant, until=until, budget=min(most, self.left))
        self.left -= found.steps
        return found


@lru_cache(maxsize=4096)
def _plain(schedule: Schedule) -> TickPlan:
    """Jobs without a window or exclusions share one plan per schedule (100,000 jobs on a few
    expressions hold a few plans, not 100,000)."""
    return TickPlan(schedule, identity=(schedule, None, None, ()))
