"""An independent reading of crontab entries and CronJob schedules, for checking the importers.

croniter expands each field into its values (it agrees with cronie and robfig/cron on the
plain forms the corpus uses); the rest is written out here from the daemons' sources, not
from hrwcron's: which day rule applies, and which instants a local wall-clock time falls on,
found with zoneinfo by brute force over the days of a window.

- cronie (``entry.c``): a day field is "star" when its text starts with ``*``; when neither
  is, a day matches if either field does. robfig/cron v3 (``parser.go``): a day field is
  star when one of its items is ``*`` or ``?`` without a step above 1.
- cronie in the host's zone (``cron.c``, Vixie's time-change cases): a fixed-time entry
  (neither minute nor hour starts with ``*``) runs once for a time a spring-forward skipped,
  as the clock jumps, and only on the first pass of a repeated hour; the others run at the
  times that exist, on both passes. That is also hrwcron's DST policy.
- cronie with ``CRON_TZ`` (``find_jobs`` converts each UTC minute to the entry's zone) and
  robfig/cron with a location: every instant whose wall time matches, so a skipped time
  never runs and a repeated one runs twice, for every entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from croniter import croniter

_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE_MS = 60_000

# entry.c, the '@' branch of load_entry.
CRONIE_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# parser.go, parseDescriptor: the same instants.
ROBFIG_DESCRIPTORS = CRONIE_MACROS


@dataclass(frozen=True)
class Reading:
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    day_or: bool
    fixed: bool


def _sets(fields: list[str]) -> list[frozenset[int]]:
    expanded, _ = croniter.expand(" ".join(fields))
    sets = []
    for values, (lo, hi) in zip(expanded, _BOUNDS, strict=True):
        if values == ["*"]:
            sets.append(frozenset(range(lo, hi + 1)))
        else:
            sets.append(frozenset(int(v) % 7 if hi == 6 else int(v) for v in values))
    return sets


def cronie_reading(expr: str) -> Reading:
    fields = CRONIE_MACROS.get(expr, expr).split()
    star = [f.startswith("*") for f in fields]
    return Reading(
        *_sets(fields), day_or=not star[2] and not star[4], fixed=not star[0] and not star[1]
    )


def _robfig_star(field: str) -> bool:
    for item in field.split(","):
        base, _, step = item.partition("/")
        if base in ("*", "?") and (not step or int(step) <= 1):
            return True
    return False


def robfig_reading(expr: str) -> Reading:
    fields = ROBFIG_DESCRIPTORS.get(expr, expr).split()
    star = [_robfig_star(f) for f in fields]
    plain = [f.replace("?", "*") for f in fields]
    # robfig has no DST classes; hrwcron's class of the same fields, for the mapping.
    wild = [f.startswith("*") or s for f, s in zip(plain, star, strict=True)]
    return Reading(
        *_sets(plain), day_or=not star[2] and not star[4], fixed=not wild[0] and not wild[1]
    )


def _ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _walls(reading: Reading, tz: ZoneInfo, start_ms: int, end_ms: int) -> Iterator[datetime]:
    day = (datetime.fromtimestamp(start_ms / 1000, tz) - timedelta(days=1)).date()
    last = (datetime.fromtimestamp(end_ms / 1000, tz) + timedelta(days=1)).date()
    one = timedelta(days=1)
    while day <= last:
        if day.month in reading.months and _day_matches(reading, day):
            for hour in sorted(reading.hours):
                for minute in sorted(reading.minutes):
                    yield datetime(day.year, day.month, day.day, hour, minute)
        day += one


def _day_matches(reading: Reading, day: date) -> bool:
    dom = day.day in reading.doms
    dow = day.isoweekday() % 7 in reading.dows
    return (dom or dow) if reading.day_or else (dom and dow)


def passes(wall: datetime, tz: ZoneInfo) -> list[int]:
    """The instants at which the clock in ``tz`` shows ``wall``: none in a gap, two in a
    repeated hour."""
    found = set()
    for fold in (0, 1):
        moment = wall.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if moment.astimezone(tz).replace(tzinfo=None) == wall:
            found.add(_ms(moment))
    return sorted(found)


def _gap_end(wall: datetime, tz: ZoneInfo) -> int:
    """The instant the clock jumps past ``wall``, a time it skips."""
    readings = [_ms(wall.replace(tzinfo=tz, fold=f).astimezone(UTC)) for f in (0, 1)]
    t = min(readings)
    while datetime.fromtimestamp(t / 1000, tz).replace(tzinfo=None) < wall:
        t += _MINUTE_MS
    return t


def wall_clock_instants(reading: Reading, zone: str, start_ms: int, end_ms: int) -> list[int]:
    """cronie with CRON_TZ, robfig/cron: every instant in (start, end] whose wall time
    matches."""
    tz = ZoneInfo(zone)
    found = {t for wall in _walls(reading, tz, start_ms, end_ms) for t in passes(wall, tz)}
    return sorted(t for t in found if start_ms < t <= end_ms)


def vixie_instants(reading: Reading, zone: str, start_ms: int, end_ms: int) -> list[int]:
    """cronie in the host's zone, and hrwcron's documented policy: fixed-time entries once,
    at the gap's end or on the first pass; the others on every pass of the times that exist."""
    tz = ZoneInfo(zone)
    found: set[int] = set()
    for wall in _walls(reading, tz, start_ms, end_ms):
        seen = passes(wall, tz)
        if not reading.fixed:
            found.update(seen)
        else:
            found.add(seen[0] if seen else _gap_end(wall, tz))
    return sorted(t for t in found if start_ms < t <= end_ms)


@cache
def transitions(zone: str, year: int) -> tuple[int, ...]:
    """The instants (ms) at which ``zone``'s UTC offset changes during ``year``."""
    tz = ZoneInfo(zone)
    t = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    found = []
    before = t.astimezone(tz).utcoffset()
    while t < end:
        t += timedelta(minutes=30)
        now = t.astimezone(tz).utcoffset()
        if now != before:
            found.append(_ms(t))
        before = now
    return tuple(found)
