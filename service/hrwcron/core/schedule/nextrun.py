"""The :class:`Schedule`: parsing an expression into one (cron, ``@every``, ``@at``, macros) and
the next and previous due instants in its zone, with the DST policy of the package docstring."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache

from hrwcron.core.schedule.civil import (
    EPOCH,
    MAX_MS,
    MAX_YEAR,
    MEMO_SIZE,
    MIN_MS,
    ZoneTable,
    as_instant_ms,
    instant_of_wall,
    schedule_error,
    wall_ms,
    zone_table,
)
from hrwcron.core.schedule.cron import Cron, compile_cron, covers_every_instant, whole_span_s
from hrwcron.core.schedule.durations import MAX_EVERY_MS, MIN_EVERY_MS, duration_ms
from hrwcron.core.schedule.fields import HASH_ITEM, MACROS, MAX_EXPRESSION_LENGTH


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule in a time zone. Build with :meth:`parse`; instances are shared."""

    expr: str
    tz: str
    fixed_time: bool
    # The job whose name H hashes; None when the expression has no H, so that every job with
    # the same plain expression shares one Schedule.
    job: str | None = None
    _cron: Cron | None = field(default=None, compare=False, repr=False)
    _every_ms: int = field(default=0, compare=False, repr=False)
    _zones: ZoneTable | None = field(default=None, compare=False, repr=False)
    _memo: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    # ``@at``: the one due instant.
    _at_ms: int | None = field(default=None, compare=False, repr=False)
    # The wall-clock span one match covers (a minute for 5 fields, a second for 6) and the
    # longest unit (second, minute, hour, day) it always covers whole; for exclusions.
    _resolution_s: int = field(default=60, compare=False, repr=False)
    _span_s: int = field(default=60, compare=False, repr=False)
    _covers_all: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Built directly rather than through parse (a copy, a test): derive the rest from expr.
        if self._cron is None and not self._every_ms and self._at_ms is None:
            parsed = Schedule.parse(self.expr, self.tz, job=self.job)
            for name in (
                "fixed_time",
                "job",
                "_cron",
                "_every_ms",
                "_zones",
                "_at_ms",
                "_resolution_s",
                "_span_s",
                "_covers_all",
            ):
                object.__setattr__(self, name, getattr(parsed, name))

    @property
    def at_ms(self) -> int | None:
        """The instant of a one-time (``@at``) schedule; None for a recurring one."""
        return self._at_ms

    def covers(self, instant: int) -> bool:
        """Whether the local wall time of ``instant`` falls on a time this cron expression
        matches, at its resolution: the whole minute for 5 fields, the second for 6. (Both
        passes of a repeated hour fall on the same wall times.) Always False for ``@every``
        and ``@at``."""
        cron = self._cron
        if cron is None:
            return False
        second = wall_ms(instant, self.tz) // 1000
        base = second - second % self._resolution_s
        return cron.next_wall(base) == base

    def covered_until(self, instant: int) -> int:
        """For an instant this expression :meth:`covers`: the first instant after the run of
        whole units around it that the expression covers entirely (seconds, minutes, hours or
        days: the finest unit whose field is not ``*``), so a search steps over a covered
        stretch at once instead of unit by unit. An expression that matches every wall time
        covers up to the end of the supported years."""
        if self._covers_all:
            return MAX_MS
        cron = self._cron
        assert cron is not None
        unit = cron.covered_run_end(wall_ms(instant, self.tz) // 1000, self._span_s)
        return instant_of_wall(unit * 1000, self.tz, after=instant)

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC", *, job: str | None = None) -> Schedule:
        """Parse ``expr`` for time zone ``tz``; ``job`` is the name ``H`` hashes (an expression
        with ``H`` and no job is refused, where = ``job``)."""
        if not isinstance(expr, str):
            raise schedule_error("expression", f"must be a string, not {type(expr).__name__}")
        if not isinstance(tz, str):
            raise schedule_error("tz", f"must be a string, not {type(tz).__name__}")
        if job is not None and not isinstance(job, str):
            raise schedule_error("job", f"must be a string, not {type(job).__name__}")
        # Only an expression with H depends on the job: the others stay shared between jobs.
        return _parse(expr, tz, job if job is not None and _uses_hash(expr) else None)

    def next_after(self, instant: datetime | int) -> int:
        """The first due instant (epoch ms) strictly after ``instant``."""
        t = as_instant_ms(instant)
        found = self._memo.get(t)
        if found is None:
            nxt = self._next(t)
            if nxt is None:
                raise schedule_error(
                    "expression", f"{self.expr!r} has no due time before {MAX_YEAR}"
                )
            found = nxt
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[t] = found
        return found

    def due_between(self, start: datetime | int, end: datetime | int) -> list[int]:
        """Due instants ``d`` with ``start < d <= end``, ascending."""
        lo, hi = as_instant_ms(start), as_instant_ms(end)
        if self._every_ms:
            step = self._every_ms
            return list(range((lo // step + 1) * step, hi + 1, step))
        out: list[int] = []
        t = lo
        while True:
            nxt = self._next(t)
            if nxt is None or nxt > hi:
                return out
            out.append(nxt)
            t = nxt

    def iter_after(self, instant: datetime | int) -> Iterator[int]:
        """Due instants strictly after ``instant``, ascending, lazily."""
        t = as_instant_ms(instant)
        while True:
            nxt = self._next(t)
            if nxt is None:
                return
            yield nxt
            t = nxt

    def _next(self, t: int) -> int | None:
        if self._every_ms:
            return (t // self._every_ms + 1) * self._every_ms
        if self._at_ms is not None:
            return self._at_ms if t < self._at_ms else None
        cron, zones = self._cron, self._zones
        if cron is None or zones is None:
            raise TypeError("schedule was not compiled")
        start, end, off, before = zones.segment(t)
        low = t + off  # wall-clock ms; the answer's wall time is later than this
        while True:
            if self.fixed_time and before > off:
                # Just after a fall-back: wall times up to where the clock was turned back
                # already fired on the first pass.
                low = max(low, start + before - 1)
            wall = cron.next_wall(low // 1000 + 1)
            if wall is None:
                return None
            due = wall * 1000 - off
            if due < end:
                return due
            # Crossing into the next run; it may start earlier than ``cross`` when ``cross``
            # is only a cache cut point, so keep measuring from ``cross``.
            cross = end
            start, end, next_off, before = zones.segment(cross)
            if self.fixed_time and next_off > off and wall * 1000 < cross + next_off:
                # The match fell into a spring-forward gap: fire as the gap ends.
                return cross
            off = next_off
            low = cross + off - 1


@lru_cache(maxsize=4096)
def _uses_hash(expr: str) -> bool:
    return HASH_ITEM.search(expr) is not None


@lru_cache(maxsize=4096)
def _parse(expr: str, tz: str, job: str | None) -> Schedule:
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise schedule_error(
            "expression",
            f"is {len(expr)} characters long; a schedule is at most {MAX_EXPRESSION_LENGTH}",
        )
    zones = zone_table(tz)
    text = expr.strip()
    if not text:
        raise schedule_error("expression", "empty cron expression")
    parts = text.split()
    head = parts[0].lower()
    if head == "@every":
        if len(parts) != 2:
            raise schedule_error("duration", "@every takes one duration, e.g. '@every 90s'")
        ms = duration_ms(parts[1])
        if ms.denominator != 1:
            raise schedule_error("duration", f"{parts[1]!r} is not a whole number of milliseconds")
        if ms < MIN_EVERY_MS:
            raise schedule_error("duration", f"{parts[1]!r} is shorter than the minimum of 1s")
        if ms > MAX_EVERY_MS:
            raise schedule_error(
                "duration", f"{parts[1][:40]!r} is longer than the maximum of 366 days"
            )
        return Schedule(expr, tz, False, _every_ms=int(ms))
    if head == "@at":
        if len(parts) != 2:
            raise schedule_error(
                "@at",
                "takes one date and time, e.g. '@at 2026-12-24T09:00:00' (local time in the "
                "job's zone) or '@at 2026-12-24T08:00:00Z'",
            )
        return Schedule(expr, tz, True, _zones=zones, _at_ms=_at_instant(parts[1], tz))
    if head.startswith("@"):
        if head not in MACROS:
            known = " ".join(MACROS)
            raise schedule_error(
                "expression", f"unknown macro {parts[0]!r}; known: {known} @every @at"
            )
        if len(parts) != 1:
            raise schedule_error("expression", f"{parts[0]} takes no fields, got {text!r}")
        parts = MACROS[head].split()
    resolution = 60
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) == 6:
        resolution = 1
    else:
        raise schedule_error(
            "expression",
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with the "
            f"second first, got {len(parts)} in {text!r}",
        )
    cron = compile_cron(parts, job)
    fixed = not parts[1].startswith("*") and not parts[2].startswith("*")
    return Schedule(
        expr,
        tz,
        fixed,
        job,
        _cron=cron,
        _zones=zones,
        _resolution_s=resolution,
        _span_s=whole_span_s(cron, resolution),
        _covers_all=covers_every_instant(cron, resolution),
    )


def _at_instant(text: str, tz: str) -> int:
    """``@at``'s instant: a date and time with ``Z`` or an offset, or local wall time in ``tz``
    read with the fixed-time DST policy (the first pass of a repeated hour; the end of the gap
    for a skipped time)."""
    example = "e.g. 2026-12-24T09:00:00 (local time in the job's zone) or 2026-12-24T08:00:00Z"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise schedule_error("@at", f"{text!r} is not a date and time, {example}") from None
    if "T" not in text.upper():
        raise schedule_error("@at", f"{text!r} has no time of day, {example}")
    if when.microsecond % 1000:
        raise schedule_error("@at", f"{text!r} is more precise than a millisecond")
    if when.tzinfo is not None:
        ms = (when - EPOCH) // timedelta(milliseconds=1)
    else:
        local = (when - datetime(1970, 1, 1)) // timedelta(milliseconds=1)
        if not MIN_MS <= local < MAX_MS:
            raise schedule_error("@at", f"{text!r} is outside the supported years 1800-8999")
        ms = instant_of_wall(local, tz)
    if not MIN_MS <= ms < MAX_MS:
        raise schedule_error("@at", f"{text!r} is outside the supported years 1800-8999")
    return ms
