"""A job's ``exclude`` entries: cron expressions or local date and time ranges, read in the
job's zone, and the ticks each one covers (see :mod:`hrwcron.core.plan` for how the plan
uses them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from hrwcron.core.errors import Problem, ScheduleError
from hrwcron.core.schedule import Schedule, instant_of_wall, wall_ms
from hrwcron.core.schedule.civil import schedule_error

DAY_MS = 86_400_000
_EPOCH_DATE = date(1970, 1, 1)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_RANGE = re.compile(r"([^.]+)(?:\.\.([^.]+))?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True, slots=True)
class Exclusion:
    """One entry of a job's ``exclude`` list, compiled for the job's zone.

    Exactly one of ``cron`` (a cron expression), ``days`` (first and last local day, days
    since 1970-01-01) or ``wall`` (local wall-time milliseconds, from included, to excluded)
    is set."""

    text: str
    tz: str
    cron: Schedule | None = None
    days: tuple[int, int] | None = None
    wall: tuple[int, int] | None = None

    def covers(self, instant: int) -> bool:
        if self.cron is not None:
            return self.cron.covers(instant)
        local = wall_ms(instant, self.tz)
        if self.days is not None:
            return self.days[0] <= local // DAY_MS <= self.days[1]
        assert self.wall is not None
        return self.wall[0] <= local < self.wall[1]

    def covered_until(self, instant: int) -> int:
        """For a covered instant: the first instant after the stretch it covers around it."""
        if self.cron is not None:
            return self.cron.covered_until(instant)
        if self.days is not None:
            end = (self.days[1] + 1) * DAY_MS
        else:
            assert self.wall is not None
            end = self.wall[1]
        return instant_of_wall(end, self.tz, after=instant)


def _local_day(text: str) -> int:
    return (date.fromisoformat(text) - _EPOCH_DATE).days


def _local_wall(text: str, where: str) -> int:
    when = datetime.fromisoformat(text)
    if when.tzinfo is not None:
        raise schedule_error(
            where,
            f"{text!r}: a range is local time in the job's zone (tz); drop the offset",
        )
    if when.microsecond % 1000:
        raise schedule_error(where, f"{text!r} is more precise than a millisecond")
    return (when - _EPOCH_NAIVE) // timedelta(milliseconds=1)


def parse_exclusion(
    text: object, tz: str, *, job: str | None = None, where: str = "exclude"
) -> Exclusion:
    """One exclusion: a cron expression (5 or 6 fields or a macro) or a local date range."""
    if not isinstance(text, str):
        raise schedule_error(where, f"must be a string, not {type(text).__name__}")
    body = text.strip()
    rule = (
        "give a cron expression ('* * 25 12 *'), a day (2026-12-25), a range of days "
        "(2026-12-24..2026-12-26) or of local times (2026-12-24T18:00..2026-12-27T06:00)"
    )
    if not body:
        raise schedule_error(where, f"is empty: {rule}")
    if any(ch.isspace() for ch in body) or body.startswith("@"):
        head = body.split()[0].lower()
        if head in ("@every", "@at"):
            raise schedule_error(where, f"{head} names no days or times to leave out: {rule}")
        try:
            schedule = Schedule.parse(body, tz, job=job)
        except ScheduleError as exc:
            raise ScheduleError(
                [Problem(where, f"{body[:80]!r}: {p}") for p in exc.problems]
            ) from None
        return Exclusion(text, tz, cron=schedule)
    found = _RANGE.fullmatch(body)
    if found is None:
        raise schedule_error(where, f"{body[:80]!r} is not understood: {rule}")
    first, last = found.group(1), found.group(2)
    ends = [first] if last is None else [first, last]
    dated = [bool(_DATE.fullmatch(end)) for end in ends]
    try:
        if all(dated):
            lo = _local_day(first)
            hi = _local_day(last) if last is not None else lo
            if hi < lo:
                raise schedule_error(where, f"{body!r} runs backwards ({last} is before {first})")
            return Exclusion(text, tz, days=(lo, hi))
        if last is None:
            datetime.fromisoformat(first)  # a word is "not understood", a time "single"
            raise schedule_error(
                where,
                f"{body!r} is a single time: give a range of local times a..b, or a cron "
                "expression",
            )
        if any(dated):
            raise schedule_error(
                where, f"{body!r}: give both ends as dates or both as date and time"
            )
        lo, hi = _local_wall(first, where), _local_wall(last, where)
    except ValueError:
        raise schedule_error(where, f"{body[:80]!r} is not understood: {rule}") from None
    if hi <= lo:
        raise schedule_error(
            where, f"{body!r} runs backwards or is empty ({last} is not after {first})"
        )
    return Exclusion(text, tz, wall=(lo, hi))
