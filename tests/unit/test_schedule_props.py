"""Schedules against a brute-force reference that walks real time.

The reference steps through UTC instants one minute (or one second) at a time around a zone's
transition, turns each into local wall time with zoneinfo, and applies the field sets and the
DST policy in the most literal way: a wall time seen before does not fire again for a fixed-time
schedule, and when the wall clock jumps forward, a fixed-time schedule that matched any skipped
wall time fires at the first instant after the jump. Expressions are generated together with the
value sets they stand for, so the reference never uses the parser under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hrwcron.schedule import Schedule

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
    "America/St_Johns",
    "Africa/Casablanca",
    "Asia/Kolkata",
]
YEARS = (2025, 2030)

# (lo, hi as written, hi reached by '*' and 'a/n', largest step)
SECOND = (0, 59, 59, 59)
MINUTE = (0, 59, 59, 59)
HOUR = (0, 23, 23, 23)
DOM = (1, 31, 31, 30)
MONTH = (1, 12, 12, 11)
DOW = (0, 7, 6, 6)


@cache
def transitions(tz: str) -> tuple[int, ...]:
    """UTC seconds at which the zone's offset changes, found by a 3-hourly scan and bisection
    (these zones never change twice within 3 hours)."""
    zone = ZoneInfo(tz)

    def offset(s: int) -> timedelta | None:
        return datetime.fromtimestamp(s, zone).utcoffset()

    found = []
    s = int(datetime(YEARS[0], 1, 1, tzinfo=UTC).timestamp())
    stop = int(datetime(YEARS[1], 1, 1, tzinfo=UTC).timestamp())
    while s < stop:
        if offset(s) != offset(s + 3 * 3600):
            lo, hi = s, s + 3 * 3600
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(s) else (lo, mid)
            found.append(hi)
        s += 3 * 3600
    return tuple(found)


@dataclass(frozen=True)
class Spec:
    expr: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    dom_star: bool
    dow_star: bool
    fixed: bool

    def matches(self, wall: datetime) -> bool:
        if not (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
        ):
            return False
        in_dom = wall.day in self.doms
        in_dow = wall.isoweekday() % 7 in self.dows
        if self.dom_star or self.dow_star:
            return in_dom and in_dow
        return in_dom or in_dow


@st.composite
def cron_field(
    draw: st.DrawFn, bounds: tuple[int, int, int, int], near: list[int]
) -> tuple[str, frozenset[int]]:
    lo, hi, star_hi, max_step = bounds
    value = st.one_of(st.sampled_from(near), st.integers(lo, hi)) if near else st.integers(lo, hi)
    kind = draw(st.sampled_from(["*", "*/n", "a", "a-b", "a-b/n", "a/n", "list"]))
    text: str
    values: set[int]
    if kind == "*":
        text, values = "*", set(range(lo, star_hi + 1))
    elif kind == "*/n":
        n = draw(st.integers(1, max_step))
        text, values = f"*/{n}", set(range(lo, star_hi + 1, n))
    elif kind == "a/n":
        a, n = draw(value), draw(st.integers(1, max_step))
        text, values = f"{a}/{n}", set(range(a, max(a, star_hi) + 1, n))
    elif kind == "list":
        items = draw(st.lists(value, min_size=1, max_size=4))
        text, values = ",".join(map(str, items)), set(items)
    else:
        a, b = sorted((draw(value), draw(value)))
        n = draw(st.integers(1, max_step)) if kind == "a-b/n" else 1
        text = f"{a}-{b}/{n}" if kind == "a-b/n" else f"{a}-{b}"
        values = set(range(a, b + 1, n))
    if bounds is DOW and 7 in values:
        values = (values - {7}) | {0}
    return text, frozenset(values)


Field = tuple[str, frozenset[int]]


def mostly_star(field: st.SearchStrategy[Field], every: range) -> st.SearchStrategy[Field]:
    return st.one_of(st.just(("*", frozenset(every))), st.just(("*", frozenset(every))), field)


@st.composite
def scenario(draw: st.DrawFn, seconds: bool) -> tuple[Spec, str, int, int, list[int]]:
    tz = draw(st.sampled_from(ZONES))
    zone = ZoneInfo(tz)
    known = transitions(tz)
    if known:
        pivot = draw(st.sampled_from(known))
    else:
        pivot = draw(st.integers(1_740_000_000, 1_890_000_000)) // 60 * 60
    # Values near the pivot's wall time on both sides, so matches land in gaps and repeats.
    before = datetime.fromtimestamp(pivot - 1, zone)
    after = datetime.fromtimestamp(pivot, zone)
    near_hours = sorted({before.hour, after.hour, (before.hour + 23) % 24, (after.hour + 1) % 24})
    near_minutes = sorted({0, 15, 30, 45, before.minute, after.minute, (before.minute + 1) % 60})
    near_days = sorted({before.day, after.day})
    near_dows = sorted({before.isoweekday() % 7, after.isoweekday() % 7, 7})

    sec_text, sec_values = (
        draw(cron_field(SECOND, [0, 30, 59])) if seconds else ("0", frozenset({0}))
    )
    min_text, min_values = draw(cron_field(MINUTE, near_minutes))
    hour_text, hour_values = draw(cron_field(HOUR, near_hours))
    dom_text, dom_values = draw(mostly_star(cron_field(DOM, near_days), range(1, 32)))
    mon_text, mon_values = draw(
        mostly_star(cron_field(MONTH, [before.month, after.month]), range(1, 13))
    )
    dow_text, dow_values = draw(mostly_star(cron_field(DOW, near_dows), range(7)))
    fields = [min_text, hour_text, dom_text, mon_text, dow_text]
    if seconds:
        fields.insert(0, sec_text)
    spec = Spec(
        expr=" ".join(fields),
        seconds=sec_values,
        minutes=min_values,
        hours=hour_values,
        doms=dom_values,
        months=mon_values,
        dows=dow_values,
        dom_star=dom_text.startswith("*"),
        dow_star=dow_text.startswith("*"),
        fixed=not min_text.startswith("*") and not hour_text.startswith("*"),
    )
    reach = 2 * 3600 if seconds else 30 * 3600
    lo, hi = (pivot - reach) * 1000, (pivot + reach) * 1000
    probes = draw(st.lists(st.integers(lo, hi - 1), min_size=1, max_size=8))
    return spec, tz, lo, hi, probes


def reference(spec: Spec, tz: str, lo_ms: int, hi_ms: int, step: int) -> list[int]:
    zone = ZoneInfo(tz)
    tick = timedelta(seconds=step)
    fired: set[int] = set()
    seen: set[datetime] = set()
    previous: datetime | None = None
    for s in range(lo_ms // 1000, hi_ms // 1000 + 1, step):
        wall = datetime.fromtimestamp(s, zone).replace(tzinfo=None)
        if previous is not None and wall - previous > tick and spec.fixed:
            skipped = previous + tick
            while skipped < wall:
                if spec.matches(skipped):
                    fired.add(s)
                    break
                skipped += tick
        if spec.matches(wall) and not (spec.fixed and wall in seen):
            fired.add(s)
        seen.add(wall)
        previous = wall
    return sorted(s * 1000 for s in fired)


def check(spec: Spec, tz: str, lo: int, hi: int, probes: list[int], step: int) -> None:
    schedule = Schedule.parse(spec.expr, tz)
    assert schedule.fixed_time is spec.fixed
    expected = [t for t in reference(spec, tz, lo, hi, step) if lo < t <= hi]
    assert schedule.due_between(lo, hi) == expected
    for probe in probes:
        later = [t for t in expected if t > probe]
        got = schedule.next_after(probe)
        if later:
            assert got == later[0], (probe, later[:3])
        else:
            assert got > hi


FAST = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SLOW = settings(FAST, max_examples=40)


@FAST
@given(scenario(seconds=False))
def test_five_fields_match_the_reference(case: tuple[Spec, str, int, int, list[int]]) -> None:
    spec, tz, lo, hi, probes = case
    check(spec, tz, lo, hi, probes, 60)


@SLOW
@given(scenario(seconds=True))
def test_six_fields_match_the_reference(case: tuple[Spec, str, int, int, list[int]]) -> None:
    spec, tz, lo, hi, probes = case
    check(spec, tz, lo, hi, probes, 1)


@settings(FAST, max_examples=100)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(["0 0 29 2 *", "0 12 13 * 5", "30 2 * * 0", "0 0 31 * *", "@monthly"]),
    st.integers(1_700_000_000_000, 1_900_000_000_000),
)
def test_iteration_is_strictly_increasing_and_consistent(tz: str, expr: str, start: int) -> None:
    schedule = Schedule.parse(expr, tz)
    dues = []
    for due in schedule.iter_after(start):
        dues.append(due)
        if len(dues) == 6:
            break
    assert dues[0] == schedule.next_after(start)
    assert all(a < b for a, b in pairwise(dues))
    assert all(schedule.next_after(a) == b for a, b in pairwise(dues))
    assert schedule.due_between(start, dues[-1]) == dues
