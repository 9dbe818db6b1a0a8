"""A compiled cron expression: its fields as lookup tables, and the search for the next and
previous wall-clock time they match, with the Vixie day rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from hrwcron.core.schedule.civil import (
    DAYS_IN_MONTH,
    MAX_YEAR,
    civil_from_days,
    days_from_civil,
    days_in_month,
    schedule_error,
)
from hrwcron.core.schedule.fields import (
    ALL_DAYS,
    DOM,
    DOW,
    HOUR,
    MIN,
    MON,
    SEC,
    Rule,
    next_table,
    parse_field,
    rule_day,
)


@dataclass(frozen=True, slots=True)
class Cron:
    """The compiled fields, with lookup tables so finding the next match is a few index reads."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    dom: frozenset[int]
    dow: frozenset[int]
    dom_rules: tuple[Rule, ...]
    dow_rules: tuple[Rule, ...]
    day_or: bool  # both day fields restricted: Vixie's OR
    all_days: bool
    first_month: int
    days: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)
    # Which days match depends only on the month's length and the weekday of its 1st: at most
    # 4 * 7 tables, whatever the year.
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def day_table(self, y: int, m: int) -> tuple[int, ...]:
        """Next matching day of month >= d (index d), or -1, for year y month m."""
        dim = days_in_month(y, m)
        if self.all_days:
            return ALL_DAYS[dim]
        key = y * 16 + m
        table = self.days.get(key)
        if table is None:
            first = (days_from_civil(y, m, 1) + 4) % 7  # 1970-01-01 was a Thursday; Sunday = 0
            table = self.month_table(dim, first)
            if len(self.days) >= 512:
                self.days.clear()
            self.days[key] = table
        return table

    def month_table(self, dim: int, first: int) -> tuple[int, ...]:
        """``day_table`` for any month of ``dim`` days whose 1st is weekday ``first``."""
        key = dim * 8 + first
        table = self.shapes.get(key)
        if table is None:
            table = next_table(self.month_days(dim, first), 33)
            self.shapes[key] = table
        return table

    def month_days(self, dim: int, first: int) -> frozenset[int]:
        in_dom = {d for d in self.dom if d <= dim}
        in_dom.update(rule_day(rule, dim, first) for rule in self.dom_rules)
        in_dow = {d for d in range(1, dim + 1) if (first + d - 1) % 7 in self.dow}
        in_dow.update(rule_day(rule, dim, first) for rule in self.dow_rules)
        days = in_dom | in_dow if self.day_or else in_dom & in_dow
        days.discard(0)
        return frozenset(days)

    def ever_matches(self, months: frozenset[int]) -> bool:
        """Whether some day of some month in ``months`` matches, in some year: every month
        starts on every weekday in some year, and February does in leap and common years."""
        return any(
            self.month_table(dim, first)[1] > 0
            for m in sorted(months)
            for dim in ((28, 29) if m == 2 else (DAYS_IN_MONTH[m],))
            for first in range(7)
        )

    def covered_run_end(self, sec: int, span: int) -> int:
        """For a matching wall second ``sec``: the first wall second after the run of whole
        ``span`` units (the finest field that is not ``*``) that match from it on. Within one
        coarser unit the field's gap table answers at once; a field that is not ``*`` has a gap
        in every coarser unit, so the run ends within two of them. Runs of days are walked a
        day at a time, at most :data:`_DAY_RUN` days."""
        if span == 86_400:
            day = sec - sec % span + span
            for _ in range(_DAY_RUN):
                if self.next_wall(day) != day:
                    break
                day += span
            return day
        if span == 1:
            table, size = self.seconds, 60
        elif span == 60:
            table, size = self.minutes, 60
        else:
            table, size = self.hours, 24
        gaps = _gap_table(table, size)
        coarse = span * size
        base = sec - sec % coarse
        value = sec % coarse // span
        for _ in range(2):
            if gaps[value] < size:
                return base + gaps[value] * span
            base += coarse
            if self.next_wall(base) != base:
                return base
            value = 0
        return base

    def next_wall(self, sec: int) -> int | None:
        """The first matching wall-clock second >= ``sec`` (seconds since 1970-01-01 local)."""
        days, rem = divmod(sec, 86_400)
        h, rem = divmod(rem, 3_600)
        mi, s = divmod(rem, 60)
        y, mo, d = civil_from_days(days)
        nsec, nmin, nhour, nmon = self.seconds, self.minutes, self.hours, self.months
        while y <= MAX_YEAR:
            m2 = nmon[mo]
            if m2 != mo:
                if m2 < 0:
                    y, mo = y + 1, self.first_month
                else:
                    mo = m2
                d, h, mi, s = 1, 0, 0, 0
            d2 = self.day_table(y, mo)[d]
            if d2 < 0:
                y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
                d, h, mi, s = 1, 0, 0, 0
                continue
            if d2 != d:
                d, h, mi, s = d2, 0, 0, 0
            h2 = nhour[h]
            if h2 < 0:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if h2 != h:
                h, mi, s = h2, 0, 0
            m3 = nmin[mi]
            if m3 < 0:
                h, mi, s = h + 1, 0, 0
                continue
            if m3 != mi:
                mi, s = m3, 0
            s2 = nsec[s]
            if s2 < 0:
                mi, s = mi + 1, 0
                continue
            return days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + s2
        return None


# A run of matching days with hours and minutes '*' (a day-of-week range, some months): a run
# longer than this is stepped over in several strides.
_DAY_RUN = 400


@lru_cache(maxsize=1024)
def _gap_table(table: tuple[int, ...], size: int) -> tuple[int, ...]:
    """``gaps[v]``: the smallest value >= v that the field leaves out, or ``size``."""
    gaps = [size] * (size + 1)
    nxt = size
    for v in range(size - 1, -1, -1):
        if table[v] != v:
            nxt = v
        gaps[v] = nxt
    return tuple(gaps)


def compile_cron(fields: list[str], job: str | None) -> Cron:
    sec, minute, hour, dom_text, month, dow_text = fields
    seconds, _ = parse_field(sec, SEC, job)
    minutes, _ = parse_field(minute, MIN, job)
    hours, _ = parse_field(hour, HOUR, job)
    dom, dom_rules = parse_field(dom_text, DOM, job)
    months, _ = parse_field(month, MON, job)
    dow, dow_rules = parse_field(dow_text, DOW, job)
    # '?' is Quartz's way of writing '*': it leaves its day field unrestricted.
    dom_star = dom_text.startswith("*") or dom_text == "?"
    dow_star = dow_text.startswith("*") or dow_text == "?"
    day_or = not dom_star and not dow_star
    cron = Cron(
        seconds=next_table(seconds, 60),
        minutes=next_table(minutes, 60),
        hours=next_table(hours, 24),
        months=next_table(months, 13),
        dom=dom,
        dow=dow,
        dom_rules=dom_rules,
        dow_rules=dow_rules,
        day_or=day_or,
        all_days=not day_or and len(dom) == 31 and len(dow) == 7 and not dom_rules + dow_rules,
        first_month=min(months),
    )
    if dom_rules or dow_rules:
        if not cron.ever_matches(months):
            dow_restricts = not day_or and (dow_rules or len(dow) < 7)
            both = (
                f" together with day-of-week {dow_text!r} (both must match when a day field "
                "starts with '*' or is '?')"
                if dow_restricts
                else ""
            )
            raise schedule_error(
                "day-of-month",
                f"no day of the month(s) {month!r} matches {dom_text!r}{both}, so it never fires",
            )
    elif not day_or and not any(d <= DAYS_IN_MONTH[m] for m in months for d in dom):
        raise schedule_error(
            "day-of-month",
            f"no day in {dom_text!r} exists in the month(s) {month!r}, so it never fires",
        )
    return cron


def _full(table: tuple[int, ...], size: int) -> bool:
    return all(table[v] == v for v in range(size))


def covers_every_instant(cron: Cron, resolution: int) -> bool:
    """Whether ``cron`` matches every wall time (``* * * * *``): as an exclusion it leaves
    nothing, which a search should learn in one step rather than one day at a time."""
    return (
        whole_span_s(cron, resolution) == 86_400
        and cron.all_days
        and all(cron.months[m] == m for m in range(1, 13))
    )


def whole_span_s(cron: Cron, resolution: int) -> int:
    """The longest unit (second, minute, hour, day) that ``cron`` covers whole wherever it
    covers one instant of it."""
    if resolution == 1 and not _full(cron.seconds, 60):
        return 1
    if not _full(cron.minutes, 60):
        return 60
    if not _full(cron.hours, 24):
        return 3_600
    return 86_400
