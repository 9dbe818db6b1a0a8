"""Cron schedules evaluated on local wall-clock time in an IANA zone, with a stated DST policy.

Every replica must compute the same due instants from the same (expression, zone), so the rules
here are explicit rather than inherited from a library:

- 5 fields ``minute hour day-of-month month day-of-week`` or 6 with the **second first**;
  macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``; ``@every <duration>``
  ticks on the multiples of the interval since the Unix epoch (the zone plays no part).
- Vixie day rule: when both day fields are restricted (neither starts with ``*``) a day matches
  if either matches; otherwise both must.
- DST (Vixie/ISC): a schedule is *fixed-time* when neither its minute nor its hour field starts
  with ``*``. A fixed-time schedule fires once at the first instant after a gap for local times
  the gap swallowed, and only on the first pass through a repeated hour. Interval-like schedules
  skip nonexistent times and fire on both passes. Firings that land on the same instant are one.

croniter is not used at run time: croniter 7 fires fixed-time schedules on both passes of a
repeated hour, reads a 6th field as seconds *last*, treats ``*/2`` in a day field as a
restriction (day OR instead of AND), accepts a 7th (year) field, silently wraps ``5-2`` and
accepts ``*/61``. A small matcher over wall time is both simpler to get right and faster.
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

from hrwcron.errors import Problem, ScheduleError

__all__ = ["Schedule", "jitter_ms", "parse_duration"]

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
_EXTENSIONS = "L, W, #, ? and H are not supported"
_EXTENSION_TOKEN = re.compile(r"[0-9]*[LW]|LW|H.*")
_SYNTAX = "use numbers{names}, '*', ranges a-b, steps /n and lists a,b"

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

    @property
    def max_step(self) -> int:
        return self.star_hi - self.lo


_FIELDS = (
    _FieldSpec("second", 0, 59, 59),
    _FieldSpec("minute", 0, 59, 59),
    _FieldSpec("hour", 0, 23, 23),
    _FieldSpec("day-of-month", 1, 31, 31),
    _FieldSpec("month", 1, 12, 12, _MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, 6, _DOW_NAMES),
)
_SEC, _MIN, _HOUR, _DOM, _MON, _DOW = _FIELDS
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


# --- parsing --------------------------------------------------------------------------------


def _value(token: str, spec: _FieldSpec, *, upper: bool = False) -> int:
    if not token:
        raise _fail(spec.name, "a value is missing (a range or step without its start or end)")
    if token.isascii() and token.isdigit():
        v = int(token)
        if not spec.lo <= v <= spec.hi:
            raise _fail(spec.name, f"{v} is out of range {spec.lo}-{spec.hi}")
        return v
    if spec.names is not None and token.lower() in spec.names:
        v = spec.names[token.lower()]
        # SAT-SUN reads as Saturday to Sunday: Sunday closing a range is 7, not 0.
        return 7 if upper and spec is _DOW and v == 0 else v
    kind = "a number or a name" if spec.names else "a number"
    hint = f" ({_EXTENSIONS})" if _EXTENSION_TOKEN.fullmatch(token.upper()) else ""
    raise _fail(spec.name, f"{token!r} is not {kind}{hint}")


def _parse_field(text: str, spec: _FieldSpec) -> frozenset[int]:
    for ch in text:
        if not (ch.isascii() and (ch.isalnum() or ch in "*,-/")):
            names = ", names" if spec.names else ""
            ext = f"; {_EXTENSIONS}" if ch in "#?" else ""
            raise _fail(spec.name, f"{ch!r} is not allowed: {_SYNTAX.format(names=names)}{ext}")
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _fail(spec.name, f"empty item in the list {text!r}")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()):
                raise _fail(spec.name, f"step {step_text!r} in {item!r} is not a number")
            step = int(step_text)
            if not 1 <= step <= spec.max_step:
                raise _fail(spec.name, f"step {step} in {item!r} is out of range 1-{spec.max_step}")
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
        values.update(range(lo, hi + 1, step))
    if spec is _DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class _Cron:
    """The compiled fields, with lookup tables so finding the next match is a few index reads."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    dom: frozenset[int]
    dow: frozenset[int]
    day_or: bool  # both day fields restricted: Vixie's OR
    all_days: bool
    first_month: int
    days: dict[int, tuple[int, ...]] = field(default_factory=dict, compare=False)

    def day_table(self, y: int, m: int) -> tuple[int, ...]:
        """Next matching day of month >= d (index d), or -1, for year y month m."""
        dim = _days_in_month(y, m)
        if self.all_days:
            return _ALL_DAYS[dim]
        key = y * 16 + m
        table = self.days.get(key)
        if table is None:
            weekday = (_days_from_civil(y, m, 1) + 4) % 7  # 1970-01-01 was a Thursday; Sunday = 0
            ok = set()
            for d in range(1, dim + 1):
                in_dom = d in self.dom
                in_dow = (weekday + d - 1) % 7 in self.dow
                if (in_dom or in_dow) if self.day_or else (in_dom and in_dow):
                    ok.add(d)
            table = _next_table(frozenset(ok), 33)
            if len(self.days) >= 512:
                self.days.clear()
            self.days[key] = table
        return table

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


def _compile(fields: list[str]) -> _Cron:
    sec, minute, hour, dom_text, month, dow_text = fields
    seconds = _parse_field(sec, _SEC)
    minutes = _parse_field(minute, _MIN)
    hours = _parse_field(hour, _HOUR)
    dom = _parse_field(dom_text, _DOM)
    months = _parse_field(month, _MON)
    dow = _parse_field(dow_text, _DOW)
    dom_star, dow_star = dom_text.startswith("*"), dow_text.startswith("*")
    day_or = not dom_star and not dow_star
    if not day_or and not any(d <= _DAYS_IN_MONTH[m] for m in months for d in dom):
        raise _fail(
            "day-of-month",
            f"no day in {dom_text!r} exists in the month(s) {month!r}, so it never fires",
        )
    return _Cron(
        seconds=_next_table(seconds, 60),
        minutes=_next_table(minutes, 60),
        hours=_next_table(hours, 24),
        months=_next_table(months, 13),
        dom=dom,
        dow=dow,
        day_or=day_or,
        all_days=not day_or and len(dom) == 31 and len(dow) == 7,
        first_month=min(months),
    )


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
    _cron: _Cron | None = field(default=None, compare=False, repr=False)
    _every_ms: int = field(default=0, compare=False, repr=False)
    _zones: _ZoneTable | None = field(default=None, compare=False, repr=False)
    _memo: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Built directly rather than through parse (a copy, a test): derive the rest from expr.
        if self._cron is None and not self._every_ms:
            parsed = _parse(self.expr, self.tz)
            for name in ("fixed_time", "_cron", "_every_ms", "_zones"):
                object.__setattr__(self, name, getattr(parsed, name))

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC") -> Schedule:
        if not isinstance(expr, str):
            raise _fail("expression", f"must be a string, not {type(expr).__name__}")
        if not isinstance(tz, str):
            raise _fail("tz", f"must be a string, not {type(tz).__name__}")
        return _parse(expr, tz)

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
def _parse(expr: str, tz: str) -> Schedule:
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
    if head.startswith("@"):
        if head not in MACROS:
            known = " ".join(MACROS)
            raise _fail("expression", f"unknown macro {parts[0]!r}; known: {known} @every")
        if len(parts) != 1:
            raise _fail("expression", f"{parts[0]} takes no fields, got {text!r}")
        parts = MACROS[head].split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise _fail(
            "expression",
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with the "
            f"second first, got {len(parts)} in {text!r}",
        )
    cron = _compile(parts)
    fixed = not parts[1].startswith("*") and not parts[2].startswith("*")
    return Schedule(expr, tz, fixed, _cron=cron, _zones=zones)


def jitter_ms(job: str, jitter_seconds: float) -> int:
    """The job's fixed offset in ``[0, jitter)`` ms: ``xxh3_64(utf8(job)) mod floor(jitter*1000)``.

    Every replica derives the same value from the name alone; 0 when there is no jitter."""
    if not math.isfinite(jitter_seconds) or jitter_seconds < 0:
        raise _fail("jitter", f"must be a finite number of seconds >= 0, not {jitter_seconds!r}")
    span = int(jitter_seconds * 1000)
    if span <= 0:
        return 0
    return int(xxhash.xxh3_64_intdigest(job.encode("utf-8")) % span)
