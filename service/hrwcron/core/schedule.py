"""Cron schedules evaluated on local wall-clock time in an IANA zone, with a stated DST policy.

Every replica must compute the same due instants from the same (expression, zone, job name), so
the rules here are explicit rather than inherited from a library:

- 5 fields ``minute hour day-of-month month day-of-week`` or 6 with the **second first**;
  macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``; ``@every <duration>``
  ticks on the multiples of the interval since the Unix epoch (the zone plays no part).
- ``@at <date and time>`` is due once: at an instant written with ``Z`` or an offset, or at a
  local time in the zone read like a fixed-time schedule (first pass of a repeated hour, the
  end of the gap for a skipped time).
- A step wider than its range keeps the range's first value only (``*/30`` in hours is hour 0),
  as Vixie cron, cronie and croniter read it; step 0 is refused.
- Forms from Quartz and EventBridge: day-of-month ``L`` (last day), ``L-n`` (n days before it,
  n 1-30), ``nW`` (the weekday nearest day n, never leaving the month; a month without day n
  has none, like a plain ``31``), ``LW`` (last weekday); day-of-week ``nL`` (last weekday n of
  the month) and ``n#k`` (k-th weekday n, k 1-5; a month without one has no match), with
  Vixie's numbering (0 and 7 Sunday); ``?`` for ``*`` in either day field. They mix with plain
  values in lists (``1,15,L``).
- Jenkins' ``H``: ``H``, ``H(a-b)``, ``H/n``, ``H(a-b)/n`` stand for values picked by
  :func:`field_hash` of the job's name, so they need the name (``Schedule.parse(..., job=)``).
  A bare ``H`` covers the field (day-of-month only 1-28, so it fires every month).
- Vixie day rule: when both day fields are restricted (neither starts with ``*`` nor is ``?``)
  a day matches if either matches; otherwise both must.
- A day-of-month that no month of the month field can ever hold is refused, with the reason.
- DST (Vixie/ISC): a schedule is *fixed-time* when neither its minute nor its hour field starts
  with ``*``. A fixed-time schedule fires once at the first instant after a gap for local times
  the gap swallowed, and only on the first pass through a repeated hour. Interval-like schedules
  skip nonexistent times and fire on both passes. Firings that land on the same instant are one.

croniter is not used at run time: croniter 7 fires fixed-time schedules on both passes of a
repeated hour, reads a 6th field as seconds *last*, treats ``*/2`` in a day field as a
restriction (day OR instead of AND), accepts a 7th (year) field, silently wraps ``5-2`` and
hashes ``H`` its own way. A small matcher over wall time is both simpler to get right and faster.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import xxhash

from hrwcron.core.errors import Problem, ScheduleError

__all__ = [
    "Schedule",
    "field_hash",
    "instant_of_wall",
    "jitter_ms",
    "parse_duration",
    "wall_ms",
]

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MIN_EVERY_MS = 1_000
# Longer intervals tick so rarely that their next tick can lie beyond the supported years.
MAX_EVERY_MS = 366 * 86_400_000
# A 6-field expression listing every value of every field is about 530 characters.
MAX_EXPRESSION_LENGTH = 1024

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_SYNTAX = "use numbers{names}, '*', ranges a-b, steps /n, lists a,b and H"
# What each field accepts beyond plain values, quoted when a token is not understood.
_FORMS = {
    "day-of-month": "day-of-month also takes L, L-n, nW, LW, ? and H",
    "day-of-week": "day-of-week also takes nL, n#k, ? and H",
}
_DAY_FORMS = "L, L-n, nW and LW are day-of-month forms; nL and n#k day-of-week forms"
_MAX_DIGITS = 9  # longer numbers are out of every range (and int() refuses 4301 digits)
_HASH_FORM = re.compile(r"H(?:\(([0-9A-Z]*)-([0-9A-Z]*)\))?(?:/([0-9]*))?")
# An item that starts with H, wherever it is; no month or weekday name starts with H.
_HASH_ITEM = re.compile(r"(?:^|[\s,])[Hh]")

# The instants a schedule is evaluated for; outside them datetime (and the zone data) run out.
_MIN_MS = -5_364_662_400_000  # 1800-01-01T00:00Z
_MAX_MS = 221_845_392_000_000  # 9000-01-01T00:00Z
_MAX_YEAR = 9100

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_MEMO_SIZE = 4096


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    lo: int
    hi: int  # the largest value accepted as written (7 for day-of-week)
    star_hi: int  # where '*' and 'a/n' stop (6 for day-of-week, so Sunday is not counted twice)
    names: dict[str, int] | None = None
    hash_hi: int = -1  # where a bare H stops, when not at star_hi

    @property
    def hash_range(self) -> tuple[int, int]:
        return self.lo, self.star_hi if self.hash_hi < 0 else self.hash_hi


_FIELDS = (
    _FieldSpec("second", 0, 59, 59),
    _FieldSpec("minute", 0, 59, 59),
    _FieldSpec("hour", 0, 23, 23),
    # A bare H in day-of-month picks from 1-28 so that the job fires every month.
    _FieldSpec("day-of-month", 1, 31, 31, hash_hi=28),
    _FieldSpec("month", 1, 12, 12, _MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, 6, _DOW_NAMES),
)
_SEC, _MIN, _HOUR, _DOM, _MON, _DOW = _FIELDS
_STAR: dict[str, tuple[frozenset[int], tuple[tuple[int, int, int], ...]]] = {
    spec.name: (frozenset(range(spec.lo, spec.star_hi + 1)), ()) for spec in _FIELDS
}
_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _fail(where: str, message: str) -> ScheduleError:
    return ScheduleError(Problem(where, message))


# --- calendar arithmetic (proleptic Gregorian, days since 1970-01-01) -------------------------


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def _days_in_month(y: int, m: int) -> int:
    if m == 2 and not (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)):
        return 28
    return _DAYS_IN_MONTH[m]


def _next_table(values: frozenset[int], size: int) -> tuple[int, ...]:
    """``table[v]`` is the smallest allowed value >= v, or -1; one slot past the end reads -1."""
    table = [-1] * (size + 1)
    nxt = -1
    for v in range(size - 1, -1, -1):
        if v in values:
            nxt = v
        table[v] = nxt
    return tuple(table)


_ALL_DAYS = {dim: _next_table(frozenset(range(1, dim + 1)), 33) for dim in (28, 29, 30, 31)}


# --- day rules: days that depend on a month's length and the weekday it starts on ----------

# A rule (kind, a, b) names at most one day in a month of ``dim`` days whose 1st falls on
# weekday ``first`` (Sunday = 0); the same (dim, first) always gives the same day.
_LAST = 0  # L-a: a days before the last day (L is L-0)
_NEAREST = 1  # aW: the weekday (Monday to Friday) nearest day a, inside the month
_LAST_WEEKDAY = 2  # LW: the last weekday (Monday to Friday) of the month
_NTH = 3  # a#b: the b-th weekday a of the month
_LAST_OF = 4  # aL: the last weekday a of the month

_Rule = tuple[int, int, int]


def _rule_day(rule: _Rule, dim: int, first: int) -> int:
    """The day of the month ``rule`` names, or 0 when this month has none."""
    kind, a, b = rule
    if kind == _LAST:
        return max(dim - a, 0)
    if kind == _NEAREST:
        if a > dim:
            return 0  # like a plain 31, 31W passes over the months without a 31st
        weekday = (first + a - 1) % 7
        if weekday == 6:  # Saturday: the Friday before, unless that is in the previous month
            return a - 1 if a > 1 else a + 2
        if weekday == 0:  # Sunday: the Monday after, unless that is in the next month
            return a + 1 if a < dim else a - 2
        return a
    if kind == _LAST_WEEKDAY:
        weekday = (first + dim - 1) % 7
        return dim - 1 if weekday == 6 else dim - 2 if weekday == 0 else dim
    if kind == _NTH:
        day = 1 + (a - first) % 7 + 7 * (b - 1)
        return day if day <= dim else 0
    return dim - (first + dim - 1 - a) % 7  # _LAST_OF


# --- parsing --------------------------------------------------------------------------------


def _digits(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _hint(token: str, spec: _FieldSpec) -> str:
    if spec.name in _FORMS:
        return f" ({_FORMS[spec.name]})"
    if re.fullmatch(r"[0-9]*[LW]|L-[0-9]*|LW|[0-9]*#[0-9]*", token.upper()):
        return f" ({_DAY_FORMS})"
    return ""


def _value(token: str, spec: _FieldSpec, *, upper: bool = False) -> int:
    if not token:
        raise _fail(spec.name, "a value is missing (a range or step without its start or end)")
    if _digits(token):
        if len(token) > _MAX_DIGITS:
            raise _fail(spec.name, f"{token[:_MAX_DIGITS]}... is out of range {spec.lo}-{spec.hi}")
        v = int(token)
        if not spec.lo <= v <= spec.hi:
            raise _fail(spec.name, f"{v} is out of range {spec.lo}-{spec.hi}")
        return v
    if spec.names is not None and token.lower() in spec.names:
        v = spec.names[token.lower()]
        # SAT-SUN reads as Saturday to Sunday: Sunday closing a range is 7, not 0.
        return 7 if upper and spec is _DOW and v == 0 else v
    kind = "a number or a name" if spec.names else "a number"
    raise _fail(spec.name, f"{token!r} is not {kind}{_hint(token, spec)}")


def _step(text: str, item: str, spec: _FieldSpec) -> int:
    if not _digits(text):
        raise _fail(spec.name, f"step {text!r} in {item!r} is not a number")
    if len(text) > _MAX_DIGITS:
        raise _fail(spec.name, f"step {text[:_MAX_DIGITS]}... in {item!r} is too large")
    step = int(text)
    if step == 0:
        raise _fail(spec.name, f"step 0 in {item!r} must be 1 or more")
    return step


def field_hash(job: str, field_name: str) -> int:
    """The number ``H`` stands on in one field of a job's schedule.

    ``xxh3_64(utf8(job) || 0x00 || utf8(field_name))``, seed 0: the HRW score of the job
    against a node named after the field (``second``, ``minute``, ``hour``, ``day-of-month``,
    ``month`` or ``day-of-week``), so each field of one job gets an independent value."""
    return xxhash.xxh3_64_intdigest(job.encode() + b"\x00" + field_name.encode())


def _hashed(item: str, spec: _FieldSpec, job: str | None) -> range:
    """Jenkins' H: one value of the range picked by the job's name (``H``, ``H(a-b)``), or, with
    a step n, every n-th value from an offset below n picked the same way (``H/n``, ``H(a-b)/n``).
    """
    form = _HASH_FORM.fullmatch(item.upper())
    if form is None:
        raise _fail(spec.name, f"{item!r} is not a hashed value: use H, H(a-b), H/n or H(a-b)/n")
    if job is None:
        raise _fail(
            "job",
            f"'H' in {spec.name} stands for a value hashed from the job's name, "
            "and no job name was given",
        )
    first, last, step_text = form.groups()
    if first is None:
        lo, hi = spec.hash_range
    else:
        lo, hi = _value(first, spec), _value(last, spec, upper=True)
        if lo > hi:
            raise _fail(spec.name, f"range in {item!r} runs backwards ({lo} > {hi})")
    span = hi - lo + 1
    h = field_hash(job, spec.name)
    if step_text is None:
        return range(lo + h % span, lo + h % span + 1)
    step = _step(step_text, item, spec)
    # A step wider than the range leaves one value, still picked by the hash.
    return range(lo + h % min(step, span), hi + 1, step)


def _dom_rule(item: str) -> _Rule | None:
    base, slash, _ = item.partition("/")
    up = base.upper()
    if up == "L":
        rule = (_LAST, 0, 0)
    elif up == "LW":
        rule = (_LAST_WEEKDAY, 0, 0)
    elif up.startswith("L-"):
        n = up[2:]
        if not (_digits(n) and len(n) <= 2 and 1 <= int(n) <= 30):
            raise _fail(
                _DOM.name,
                f"{item!r}: L-n counts n days back from the last day, n from 1 to 30",
            )
        rule = (_LAST, int(n), 0)
    elif up.endswith("W") and _digits(up[:-1]):
        rule = (_NEAREST, _value(up[:-1], _DOM), 0)
    else:
        return None
    if slash:
        raise _fail(_DOM.name, f"{item!r}: a step does not apply to {base!r}")
    return rule


def _dow_rule(item: str) -> _Rule | None:
    base, slash, _ = item.partition("/")
    up = base.upper()
    if "#" in base:
        day, _, nth = base.partition("#")
        weekday = _value(day, _DOW) % 7
        if not (_digits(nth) and len(nth) == 1 and 1 <= int(nth) <= 5):
            raise _fail(
                _DOW.name, f"{item!r}: in n#k, k is from 1 to 5 (the k-th weekday n of the month)"
            )
        rule = (_NTH, weekday, int(nth))
    elif up == "L":
        raise _fail(
            _DOW.name,
            "'L' alone is not a day of the week: nL is the last weekday n of the month, "
            "e.g. 5L the last Friday",
        )
    elif up.endswith("L"):
        rule = (_LAST_OF, _value(base[:-1], _DOW) % 7, 0)
    elif up.startswith("L") and _digits(up[1:]):
        raise _fail(_DOW.name, f"{item!r}: write the last weekday n of the month as nL, e.g. 5L")
    else:
        return None
    if slash:
        raise _fail(_DOW.name, f"{item!r}: a step does not apply to {base!r}")
    return rule


def _check_chars(text: str, spec: _FieldSpec) -> None:
    day_field = spec is _DOM or spec is _DOW
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch in "*,-/()"):
            continue
        if (ch == "#" and spec is _DOW) or (ch == "?" and day_field):
            continue
        if ch == "#":
            message = "'#' belongs in day-of-week only (n#k: the k-th weekday n of the month)"
        elif ch == "?":
            message = "'?' belongs in day-of-month and day-of-week only (it means '*')"
        else:
            names = ", names" if spec.names else ""
            message = f"{ch!r} is not allowed: {_SYNTAX.format(names=names)}"
        raise _fail(spec.name, message)


def _parse_field(
    text: str, spec: _FieldSpec, job: str | None
) -> tuple[frozenset[int], tuple[_Rule, ...]]:
    """The values a field allows, and (day fields only) the rules that depend on the month."""
    if text == "*" or (text == "?" and (spec is _DOM or spec is _DOW)):
        return _STAR[spec.name]  # most fields of most schedules
    _check_chars(text, spec)
    if "?" in text:
        raise _fail(spec.name, f"'?' stands alone for the whole field (it means '*'): {text!r}")
    values: set[int] = set()
    rules: list[_Rule] = []
    for item in text.split(","):
        if not item:
            raise _fail(spec.name, f"empty item in the list {text!r}")
        if item[0] in "Hh":
            values.update(_hashed(item, spec, job))
            continue
        if not item.isdigit():  # plain numbers, the common case, are never day rules
            rule = _dom_rule(item) if spec is _DOM else _dow_rule(item) if spec is _DOW else None
            if rule is not None:
                rules.append(rule)
                continue
        base, slash, step_text = item.partition("/")
        step = _step(step_text, item, spec) if slash else 1
        if base == "*":
            lo, hi = spec.lo, spec.star_hi
        elif "-" in base:
            first, _, last = base.partition("-")
            if "-" in last:
                raise _fail(spec.name, f"{item!r} is not a range a-b")
            lo, hi = _value(first, spec), _value(last, spec, upper=True)
            if lo > hi:
                raise _fail(spec.name, f"range {base!r} runs backwards ({lo} > {hi})")
        else:
            lo = _value(base, spec)
            # 'a/n' means from a to the end of the field, as croniter and robfig/cron read it.
            hi = max(lo, spec.star_hi) if slash else lo
        # A step wider than the range keeps the range's first value only (Vixie cron, cronie
        # and croniter agree): '*/30' in hours is hour 0.
        values.update(range(lo, hi + 1, step))
    if spec is _DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values), tuple(rules)


@dataclass(frozen=True, slots=True)
class _Cron:
    """The compiled fields, with lookup tables so finding the next match is a few index reads."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    dom: frozenset[int]
    dow: frozenset[int]
    dom_rules: tuple[_Rule, ...]
    dow_rules: tuple[_Rule, ...]
    day_or: bool  # both day fields restricted: Vixie's OR
    all_days: bool
    first_month: int
    days: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)
    # Which days match depends only on the month's length and the weekday of its 1st: at most
    # 4 * 7 tables, whatever the year.
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def day_table(self, y: int, m: int) -> tuple[int, ...]:
        """Next matching day of month >= d (index d), or -1, for year y month m."""
        dim = _days_in_month(y, m)
        if self.all_days:
            return _ALL_DAYS[dim]
        key = y * 16 + m
        table = self.days.get(key)
        if table is None:
            first = (_days_from_civil(y, m, 1) + 4) % 7  # 1970-01-01 was a Thursday; Sunday = 0
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
            table = _next_table(self.month_days(dim, first), 33)
            self.shapes[key] = table
        return table

    def month_days(self, dim: int, first: int) -> frozenset[int]:
        in_dom = {d for d in self.dom if d <= dim}
        in_dom.update(_rule_day(rule, dim, first) for rule in self.dom_rules)
        in_dow = {d for d in range(1, dim + 1) if (first + d - 1) % 7 in self.dow}
        in_dow.update(_rule_day(rule, dim, first) for rule in self.dow_rules)
        days = in_dom | in_dow if self.day_or else in_dom & in_dow
        days.discard(0)
        return frozenset(days)

    def ever_matches(self, months: frozenset[int]) -> bool:
        """Whether some day of some month in ``months`` matches, in some year: every month
        starts on every weekday in some year, and February does in leap and common years."""
        return any(
            self.month_table(dim, first)[1] > 0
            for m in sorted(months)
            for dim in ((28, 29) if m == 2 else (_DAYS_IN_MONTH[m],))
            for first in range(7)
        )

    def next_wall(self, sec: int) -> int | None:
        """The first matching wall-clock second >= ``sec`` (seconds since 1970-01-01 local)."""
        days, rem = divmod(sec, 86_400)
        h, rem = divmod(rem, 3_600)
        mi, s = divmod(rem, 60)
        y, mo, d = _civil_from_days(days)
        nsec, nmin, nhour, nmon = self.seconds, self.minutes, self.hours, self.months
        while y <= _MAX_YEAR:
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
            return _days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + s2
        return None


def _compile(fields: list[str], job: str | None) -> _Cron:
    sec, minute, hour, dom_text, month, dow_text = fields
    seconds, _ = _parse_field(sec, _SEC, job)
    minutes, _ = _parse_field(minute, _MIN, job)
    hours, _ = _parse_field(hour, _HOUR, job)
    dom, dom_rules = _parse_field(dom_text, _DOM, job)
    months, _ = _parse_field(month, _MON, job)
    dow, dow_rules = _parse_field(dow_text, _DOW, job)
    # '?' is Quartz's way of writing '*': it leaves its day field unrestricted.
    dom_star = dom_text.startswith("*") or dom_text == "?"
    dow_star = dow_text.startswith("*") or dow_text == "?"
    day_or = not dom_star and not dow_star
    cron = _Cron(
        seconds=_next_table(seconds, 60),
        minutes=_next_table(minutes, 60),
        hours=_next_table(hours, 24),
        months=_next_table(months, 13),
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
            raise _fail(
                "day-of-month",
                f"no day of the month(s) {month!r} matches {dom_text!r}{both}, so it never fires",
            )
    elif not day_or and not any(d <= _DAYS_IN_MONTH[m] for m in months for d in dom):
        raise _fail(
            "day-of-month",
            f"no day in {dom_text!r} exists in the month(s) {month!r}, so it never fires",
        )
    return cron


_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


def _duration_ms(text: str) -> Fraction:
    """Exact milliseconds in ``text``: one or more <number><unit> with units h, m, s, ms."""
    rule = "use numbers with units h, m, s or ms, e.g. 90s, 5m, 1h30m, 250ms"
    if not isinstance(text, str) or not text.strip():
        raise _fail("duration", f"empty duration: {rule}")
    body = text.strip()
    if not _DURATION.fullmatch(body):
        raise _fail("duration", f"{text!r} is not a duration: {rule}")
    return sum(
        (Fraction(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(body)), start=Fraction(0)
    )


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``5m``, ``1h30m``, ``250ms``, ``1.5h``."""
    return float(_duration_ms(text) / 1000)


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise _fail("tz", "empty time zone: give an IANA zone such as 'UTC' or 'Europe/Berlin'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise _fail(
            "tz", f"{tz!r} is not an IANA time zone (e.g. 'UTC', 'Europe/Berlin')"
        ) from None


# --- time zones as segments of constant UTC offset -----------------------------------------

# Offsets are probed once a day: every transition in tzdata since 1970 is at least weeks from
# the next, so a day's step finds each one, and bisection pins it to the second.
_CHUNK_S = 1 << 24  # about 194 days
_PROBE_S = 86_400


class _ZoneTable:
    """Where a zone's UTC offset changes, found lazily by probing, cached per ~half year."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self.chunks: dict[int, list[tuple[int, int]]] = {}
        self.windows: dict[int, tuple[list[int], list[int]]] = {}

    def offset_s(self, s: int) -> int:
        delta = (_EPOCH + timedelta(seconds=s)).astimezone(self.zone).utcoffset()
        return 0 if delta is None else delta // _SECOND

    def chunk(self, c: int) -> list[tuple[int, int]]:
        """(transition second, offset from it on) for transitions in (c*C, (c+1)*C]."""
        found = self.chunks.get(c)
        if found is None:
            found = []
            lo = c * _CHUNK_S
            end = lo + _CHUNK_S
            lo_off = self.offset_s(lo)
            while lo < end:
                hi = min(lo + _PROBE_S, end)
                hi_off = self.offset_s(hi)
                if hi_off != lo_off:
                    a, b = lo, hi  # offset(a) == lo_off, offset(b) != lo_off
                    while b - a > 1:
                        mid = (a + b) // 2
                        if self.offset_s(mid) == lo_off:
                            a = mid
                        else:
                            b = mid
                    found.append((b, self.offset_s(b)))
                lo, lo_off = hi, hi_off
            self.chunks[c] = found
        return found

    def window(self, k: int) -> tuple[list[int], list[int]]:
        """Transition instants (ms) in ((k-1)C, (k+2)C] and the offset (ms) before/after each:
        ``offs[i]`` holds between ``times[i-1]`` and ``times[i]``."""
        win = self.windows.get(k)
        if win is None:
            times: list[int] = []
            offs = [self.offset_s((k - 1) * _CHUNK_S) * 1000]
            for c in (k - 1, k, k + 1):
                for t, off in self.chunk(c):
                    times.append(t * 1000)
                    offs.append(off * 1000)
            win = (times, offs)
            if len(self.windows) >= 256:
                self.windows.clear()
            self.windows[k] = win
        return win

    def segment(self, x: int) -> tuple[int, int, int, int]:
        """(start, end, offset, offset before start) of the constant-offset run holding ``x``.
        Both ends may be artificial cut points where the offset does not change."""
        k = (x // 1000) // _CHUNK_S
        times, offs = self.window(k)
        i = bisect_right(times, x)
        start = times[i - 1] if i else (k - 1) * _CHUNK_S * 1000
        end = times[i] if i < len(times) else (k + 2) * _CHUNK_S * 1000
        return start, end, offs[i], offs[i - 1] if i else offs[0]


@lru_cache(maxsize=512)
def _zone_table(tz: str) -> _ZoneTable:
    return _ZoneTable(_zone(tz))


def wall_ms(instant_ms: int, tz: str) -> int:
    """The local wall-clock time of ``instant_ms`` in ``tz``, as milliseconds since
    1970-01-01T00:00 local (both passes of a repeated hour give the same wall times)."""
    return instant_ms + _zone_table(tz).segment(instant_ms)[2]


def instant_of_wall(wall: int, tz: str, *, after: int | None = None) -> int:
    """The first instant (strictly after ``after`` when given) at which the local clock in
    ``tz`` shows ``wall`` or later: the first pass of a repeated time, and the end of the gap
    for a time a spring-forward skipped, as the DST policy of fixed-time schedules reads them.
    """
    zones = _zone_table(tz)
    # No zone is more than 26 hours off UTC, so the clock shows less than ``wall`` here.
    t = wall - 26 * 3_600_000 if after is None else after + 1
    while True:
        _, end, off, _ = zones.segment(t)
        if t + off >= wall:
            return t  # at ``after`` already, or the clock jumped over ``wall`` at a transition
        if wall - off < end:
            return wall - off
        t = end


# --- the schedule ---------------------------------------------------------------------------


def _instant_ms(instant: datetime | int) -> int:
    if isinstance(instant, datetime):
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise _fail(
                "instant",
                f"naive datetime: {instant.isoformat()} has no time zone; "
                "give an aware datetime or epoch milliseconds",
            )
        ms = (instant - _EPOCH) // timedelta(milliseconds=1)
    elif isinstance(instant, int) and not isinstance(instant, bool):
        ms = instant
    else:
        raise TypeError(f"instant must be an aware datetime or epoch ms, not {type(instant)!r}")
    if not _MIN_MS <= ms < _MAX_MS:
        raise _fail("instant", f"{ms} ms is outside the supported years 1800-8999")
    return ms


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule in a time zone. Build with :meth:`parse`; instances are shared."""

    expr: str
    tz: str
    fixed_time: bool
    # The job whose name H hashes; None when the expression has no H, so that every job with
    # the same plain expression shares one Schedule.
    job: str | None = None
    _cron: _Cron | None = field(default=None, compare=False, repr=False)
    _every_ms: int = field(default=0, compare=False, repr=False)
    _zones: _ZoneTable | None = field(default=None, compare=False, repr=False)
    _memo: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    # ``@at``: the one due instant.
    _at_ms: int | None = field(default=None, compare=False, repr=False)
    # The wall-clock span one match covers (a minute for 5 fields, a second for 6) and the
    # longest unit (second, minute, hour, day) it always covers whole; for exclusions.
    _resolution_s: int = field(default=60, compare=False, repr=False)
    _span_s: int = field(default=60, compare=False, repr=False)

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
            ):
                object.__setattr__(self, name, getattr(parsed, name))

    @property
    def at_ms(self) -> int | None:
        """The instant of a one-time (``@at``) schedule; None for a recurring one."""
        return self._at_ms

    @property
    def is_cron(self) -> bool:
        """Whether this is a cron expression or macro (not ``@every`` or ``@at``)."""
        return self._cron is not None

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
        """For an instant this expression :meth:`covers`: the first instant after the longest
        whole unit around it that the expression covers entirely (its minute, hour or day,
        when the finer fields are ``*``), so a search can step over a covered stretch."""
        wall = wall_ms(instant, self.tz)
        span = self._span_s * 1000
        return instant_of_wall((wall // span + 1) * span, self.tz, after=instant)

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC", *, job: str | None = None) -> Schedule:
        """Parse ``expr`` for time zone ``tz``; ``job`` is the name ``H`` hashes (an expression
        with ``H`` and no job is refused, where = ``job``)."""
        if not isinstance(expr, str):
            raise _fail("expression", f"must be a string, not {type(expr).__name__}")
        if not isinstance(tz, str):
            raise _fail("tz", f"must be a string, not {type(tz).__name__}")
        if job is not None and not isinstance(job, str):
            raise _fail("job", f"must be a string, not {type(job).__name__}")
        # Only an expression with H depends on the job: the others stay shared between jobs.
        return _parse(expr, tz, job if job is not None and _uses_hash(expr) else None)

    def next_after(self, instant: datetime | int) -> int:
        """The first due instant (epoch ms) strictly after ``instant``."""
        t = _instant_ms(instant)
        found = self._memo.get(t)
        if found is None:
            nxt = self._next(t)
            if nxt is None:
                raise _fail("expression", f"{self.expr!r} has no due time before {_MAX_YEAR}")
            found = nxt
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[t] = found
        return found

    def due_between(self, start: datetime | int, end: datetime | int) -> list[int]:
        """Due instants ``d`` with ``start < d <= end``, ascending."""
        lo, hi = _instant_ms(start), _instant_ms(end)
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
        t = _instant_ms(instant)
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
    return _HASH_ITEM.search(expr) is not None


@lru_cache(maxsize=4096)
def _parse(expr: str, tz: str, job: str | None) -> Schedule:
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise _fail(
            "expression",
            f"is {len(expr)} characters long; a schedule is at most {MAX_EXPRESSION_LENGTH}",
        )
    zones = _zone_table(tz)
    text = expr.strip()
    if not text:
        raise _fail("expression", "empty cron expression")
    parts = text.split()
    head = parts[0].lower()
    if head == "@every":
        if len(parts) != 2:
            raise _fail("duration", "@every takes one duration, e.g. '@every 90s'")
        ms = _duration_ms(parts[1])
        if ms.denominator != 1:
            raise _fail("duration", f"{parts[1]!r} is not a whole number of milliseconds")
        if ms < MIN_EVERY_MS:
            raise _fail("duration", f"{parts[1]!r} is shorter than the minimum of 1s")
        if ms > MAX_EVERY_MS:
            raise _fail("duration", f"{parts[1][:40]!r} is longer than the maximum of 366 days")
        return Schedule(expr, tz, False, _every_ms=int(ms))
    if head == "@at":
        if len(parts) != 2:
            raise _fail(
                "@at",
                "takes one date and time, e.g. '@at 2026-12-24T09:00:00' (local time in the "
                "job's zone) or '@at 2026-12-24T08:00:00Z'",
            )
        return Schedule(expr, tz, True, _zones=zones, _at_ms=_at_instant(parts[1], tz))
    if head.startswith("@"):
        if head not in MACROS:
            known = " ".join(MACROS)
            raise _fail("expression", f"unknown macro {parts[0]!r}; known: {known} @every @at")
        if len(parts) != 1:
            raise _fail("expression", f"{parts[0]} takes no fields, got {text!r}")
        parts = MACROS[head].split()
    resolution = 60
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) == 6:
        resolution = 1
    else:
        raise _fail(
            "expression",
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with the "
            f"second first, got {len(parts)} in {text!r}",
        )
    cron = _compile(parts, job)
    fixed = not parts[1].startswith("*") and not parts[2].startswith("*")
    return Schedule(
        expr,
        tz,
        fixed,
        job,
        _cron=cron,
        _zones=zones,
        _resolution_s=resolution,
        _span_s=_whole_span_s(cron, resolution),
    )


def _full(table: tuple[int, ...], size: int) -> bool:
    return all(table[v] == v for v in range(size))


def _whole_span_s(cron: _Cron, resolution: int) -> int:
    """The longest unit (second, minute, hour, day) that ``cron`` covers whole wherever it
    covers one instant of it."""
    if resolution == 1 and not _full(cron.seconds, 60):
        return 1
    if not _full(cron.minutes, 60):
        return 60
    if not _full(cron.hours, 24):
        return 3_600
    return 86_400


def _at_instant(text: str, tz: str) -> int:
    """``@at``'s instant: a date and time with ``Z`` or an offset, or local wall time in ``tz``
    read with the fixed-time DST policy (the first pass of a repeated hour; the end of the gap
    for a skipped time)."""
    example = "e.g. 2026-12-24T09:00:00 (local time in the job's zone) or 2026-12-24T08:00:00Z"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise _fail("@at", f"{text!r} is not a date and time, {example}") from None
    if "T" not in text.upper():
        raise _fail("@at", f"{text!r} has no time of day, {example}")
    if when.microsecond % 1000:
        raise _fail("@at", f"{text!r} is more precise than a millisecond")
    if when.tzinfo is not None:
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
    else:
        local = (when - datetime(1970, 1, 1)) // timedelta(milliseconds=1)
        if not _MIN_MS <= local < _MAX_MS:
            raise _fail("@at", f"{text!r} is outside the supported years 1800-8999")
        ms = instant_of_wall(local, tz)
    if not _MIN_MS <= ms < _MAX_MS:
        raise _fail("@at", f"{text!r} is outside the supported years 1800-8999")
    return ms


def jitter_ms(job: str, jitter_seconds: float) -> int:
    """The job's fixed offset in ``[0, jitter)`` ms: ``xxh3_64(utf8(job)) mod floor(jitter*1000)``.

    Every replica derives the same value from the name alone; 0 when there is no jitter."""
    if not math.isfinite(jitter_seconds) or jitter_seconds < 0:
        raise _fail("jitter", f"must be a finite number of seconds >= 0, not {jitter_seconds!r}")
    span = int(jitter_seconds * 1000)
    if span <= 0:
        return 0
    return int(xxhash.xxh3_64_intdigest(job.encode("utf-8")) % span)
