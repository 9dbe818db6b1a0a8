"""Schedules against a brute-force reference that walks real time.

The reference steps through UTC instants one minute (or one second) at a time around a zone's
transition, turns each into local wall time with zoneinfo, and applies the field sets and the
DST policy in the most literal way: a wall time seen before does not fire again for a fixed-time
schedule, and when the wall clock jumps forward, a fixed-time schedule that matched any skipped
wall time fires at the first instant after the jump. Expressions are generated together with the
value sets and day rules they stand for (L, L-n, nW, LW, nL, n#k, '?', H, wide steps), and the
reference states each day rule in its own words (nW is "the weekday of the month closest to day
n"), so it never uses the parser under test.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from hrwcron.core.errors import ScheduleError
from hrwcron.core.schedule import Schedule

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

# (name, lo, hi as written, hi reached by '*' and 'a/n', largest step within the field)
SECOND = ("second", 0, 59, 59, 59)
MINUTE = ("minute", 0, 59, 59, 59)
HOUR = ("hour", 0, 23, 23, 23)
DOM = ("day-of-month", 1, 31, 31, 30)
MONTH = ("month", 1, 12, 12, 11)
DOW = ("day-of-week", 0, 7, 6, 6)
Bounds = tuple[str, int, int, int, int]
JOBS = ["reports.daily", "billing.nightly", "job-7", "ジョブ.毎日"]


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


# A day rule as the reference reads it: ("L", n) n days before the last day, ("W", n) the weekday
# closest to day n inside the month, ("LW", 0) the last weekday, ("#", (w, k)) the k-th weekday w,
# ("WL", w) the last weekday w.
DayRule = tuple[str, int | tuple[int, int]]


@cache
def rule_days(rule: DayRule, year: int, month: int) -> frozenset[int]:
    """The days of one month that ``rule`` names, read off the month's calendar."""
    kind, arg = rule
    last = calendar.monthrange(year, month)[1]
    days = [date(year, month, d) for d in range(1, last + 1)]
    workdays = [d.day for d in days if d.weekday() < 5]
    if kind == "#":
        assert isinstance(arg, tuple)
        same = [d.day for d in days if d.isoweekday() % 7 == arg[0] % 7]
        return frozenset(same[arg[1] - 1 : arg[1]])
    assert isinstance(arg, int)
    if kind == "L":
        return frozenset({last - arg} - {0, -1})
    if kind == "W":
        return frozenset({min(workdays, key=lambda d: abs(d - arg))} if arg <= last else ())
    if kind == "LW":
        return frozenset({workdays[-1]})
    return frozenset({[d.day for d in days if d.isoweekday() % 7 == arg % 7][-1]})  # "WL"


def rule_matches(rule: DayRule, day: date) -> bool:
    return day.day in rule_days(rule, day.year, day.month)


@dataclass(frozen=True)
class Spec:
    expr: str
    job: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    dom_rules: tuple[DayRule, ...]
    dow_rules: tuple[DayRule, ...]
    dom_star: bool
    dow_star: bool
    fixed: bool

    def day_matches(self, day: date) -> bool:
        in_dom = day.day in self.doms or any(rule_matches(r, day) for r in self.dom_rules)
        in_dow = day.isoweekday() % 7 in self.dows or any(
            rule_matches(r, day) for r in self.dow_rules
        )
        if self.dom_star or self.dow_star:
            return in_dom and in_dow
        return in_dom or in_dow

    def matches(self, wall: datetime) -> bool:
        if not (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
        ):
            return False
        return self.day_matches(wall.date())


def step_size(bounds: Bounds) -> st.SearchStrategy[int]:
    max_step = bounds[4]
    # Steps wider than the field are allowed and keep the range's first value only.
    return st.one_of(st.integers(1, max_step), st.integers(max_step + 1, 3 * max_step))


@st.composite
def hash_item(draw: st.DrawFn, bounds: Bounds, job: str) -> tuple[str, set[int]]:
    """Jenkins' H as docs/schedules.md defines it: xxh3_64(job NUL field name) picks one value
    of the range, or with a step n an offset below min(n, size of the range) to step from."""
    name, lo, hi, star_hi, _ = bounds
    h = xxh3_64_intdigest(job.encode() + b"\x00" + name.encode())
    if draw(st.booleans()):
        a, b = sorted((draw(st.integers(lo, hi)), draw(st.integers(lo, hi))))
        text = f"H({a}-{b})"
    else:
        a, b = lo, 28 if bounds is DOM else star_hi
        text = "H"
    span = b - a + 1
    if draw(st.booleans()):
        n = draw(step_size(bounds))
        return f"{text}/{n}", set(range(a + h % min(n, span), b + 1, n))
    return text, {a + h % span}


Field = tuple[str, frozenset[int], tuple[DayRule, ...]]


@st.composite
def cron_field(
    draw: st.DrawFn,
    bounds: Bounds,
    near: list[int],
    job: str,
    rules: list[tuple[str, DayRule]] | None = None,
) -> Field:
    _, lo, hi, star_hi, _ = bounds
    value = st.one_of(st.sampled_from(near), st.integers(lo, hi)) if near else st.integers(lo, hi)
    kinds = ["*", "*/n", "a", "a-b", "a-b/n", "a/n", "list", "H"] + ["rule"] * 4 * bool(rules)
    kind = draw(st.sampled_from(kinds))
    text: str
    values: set[int] = set()
    found: list[DayRule] = []
    if kind == "*":
        text, values = "*", set(range(lo, star_hi + 1))
    elif kind == "*/n":
        n = draw(step_size(bounds))
        text, values = f"*/{n}", set(range(lo, star_hi + 1, n))
    elif kind == "a/n":
        a, n = draw(value), draw(step_size(bounds))
        text, values = f"{a}/{n}", set(range(a, max(a, star_hi) + 1, n))
    elif kind == "list":
        items = draw(st.lists(value, min_size=1, max_size=4))
        text, values = ",".join(map(str, items)), set(items)
    elif kind == "H":
        text, values = draw(hash_item(bounds, job))
    elif kind == "rule":
        assert rules
        picked = draw(st.lists(st.sampled_from(rules), min_size=1, max_size=2))
        texts = [t for t, _ in picked]
        found = [r for _, r in picked]
        if draw(st.booleans()):
            plain = draw(value)
            texts.append(str(plain))
            values.add(plain)
        text = ",".join(draw(st.permutations(texts)))
    else:
        a, b = sorted((draw(value), draw(value)))
        n = draw(step_size(bounds)) if kind == "a-b/n" else 1
        text = f"{a}-{b}/{n}" if kind == "a-b/n" else f"{a}-{b}"
        values = set(range(a, b + 1, n))
    if bounds is DOW and 7 in values:
        values = (values - {7}) | {0}
    return text, frozenset(values), tuple(found)


def dom_rules_near(days: list[date]) -> list[tuple[str, DayRule]]:
    """Day-of-month rules that name one of ``days`` or a day next to it."""
    out: list[tuple[str, DayRule]] = [("L", ("L", 0)), ("LW", ("LW", 0))]
    for day in days:
        last = calendar.monthrange(day.year, day.month)[1]
        for n in (last - day.day, last - day.day + 1):
            if 1 <= n <= 30:
                out.append((f"L-{n}", ("L", n)))
        for n in range(max(day.day - 2, 1), min(day.day + 2, 31) + 1):
            out.append((f"{n}W", ("W", n)))
    return out


def dow_rules_near(days: list[date]) -> list[tuple[str, DayRule]]:
    """Day-of-week rules that name one of ``days`` or a week next to it; Sunday as 0 and 7."""
    out: list[tuple[str, DayRule]] = []
    for day in days:
        weekday = day.isoweekday() % 7
        k = (day.day - 1) // 7 + 1
        for w in {weekday, weekday or 7}:
            out.append((f"{w}L", ("WL", w)))
            for nth in {k, max(k - 1, 1), min(k + 1, 5)}:
                out.append((f"{w}#{nth}", ("#", (w, nth))))
    return out


def mostly_star(
    field: st.SearchStrategy[Field], every: range, question: bool = False
) -> st.SearchStrategy[Field]:
    texts = ["*", "?"] if question else ["*"]
    star = st.sampled_from(texts).map(lambda text: (text, frozenset(every), ()))
    return st.one_of(star, star, field)


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
    days = sorted({before.date(), after.date()})
    job = draw(st.sampled_from(JOBS))

    sec_text, sec_values, _ = (
        draw(cron_field(SECOND, [0, 30, 59], job)) if seconds else ("0", frozenset({0}), ())
    )
    min_text, min_values, _ = draw(cron_field(MINUTE, near_minutes, job))
    hour_text, hour_values, _ = draw(cron_field(HOUR, near_hours, job))
    dom_text, dom_values, dom_rules = draw(
        mostly_star(cron_field(DOM, near_days, job, dom_rules_near(days)), range(1, 32), True)
    )
    mon_text, mon_values, _ = draw(
        mostly_star(cron_field(MONTH, [before.month, after.month], job), range(1, 13))
    )
    dow_text, dow_values, dow_rules = draw(
        mostly_star(cron_field(DOW, near_dows, job, dow_rules_near(days)), range(7), True)
    )
    fields = [min_text, hour_text, dom_text, mon_text, dow_text]
    if seconds:
        fields.insert(0, sec_text)
    spec = Spec(
        expr=" ".join(fields),
        job=job,
        seconds=sec_values,
        minutes=min_values,
        hours=hour_values,
        doms=dom_values,
        months=mon_values,
        dows=dow_values,
        dom_rules=dom_rules,
        dow_rules=dow_rules,
        dom_star=dom_text.startswith("*") or dom_text == "?",
        dow_star=dow_text.startswith("*") or dow_text == "?",
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


def parse_or_refused(spec: Spec, tz: str) -> Schedule | None:
    """The schedule, or None when the parser refused it as never firing; the refusal is checked
    against the reference: no day of 2000-2027 may match (those years hold every month, leap
    February included, starting on every weekday)."""
    try:
        return Schedule.parse(spec.expr, tz, job=spec.job)
    except ScheduleError as exc:
        assert "never fires" in str(exc), exc
        first = date(2000, 1, 1)
        every_day = (first + timedelta(days=i) for i in range((date(2028, 1, 1) - first).days))
        assert not any(day.month in spec.months and spec.day_matches(day) for day in every_day), (
            spec.expr
        )
        return None


def check(spec: Spec, tz: str, lo: int, hi: int, probes: list[int], step: int) -> None:
    schedule = parse_or_refused(spec, tz)
    if schedule is None:
        return
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


@st.composite
def day_scenario(draw: st.DrawFn) -> tuple[Spec, date]:
    """A daily schedule at midnight UTC with day rules named for a random day, so the months
    around it exercise lengths 28-31 and every weekday a month can start on."""
    start = draw(st.dates(date(1999, 1, 1), date(2101, 1, 1)))
    days = [start + timedelta(days=i) for i in range(0, 400, 37)]
    job = draw(st.sampled_from(JOBS))
    dom_text, dom_values, dom_rules = draw(
        mostly_star(
            cron_field(DOM, [d.day for d in days], job, dom_rules_near(days)), range(1, 32), True
        )
    )
    dow_text, dow_values, dow_rules = draw(
        mostly_star(cron_field(DOW, [0, 5, 7], job, dow_rules_near(days)), range(7), True)
    )
    spec = Spec(
        expr=f"0 0 {dom_text} * {dow_text}",
        job=job,
        seconds=frozenset({0}),
        minutes=frozenset({0}),
        hours=frozenset({0}),
        doms=dom_values,
        months=frozenset(range(1, 13)),
        dows=dow_values,
        dom_rules=dom_rules,
        dow_rules=dow_rules,
        dom_star=dom_text.startswith("*") or dom_text == "?",
        dow_star=dow_text.startswith("*") or dow_text == "?",
        fixed=True,
    )
    return spec, start


@settings(FAST, max_examples=100)
@given(day_scenario())
def test_day_rules_match_a_day_by_day_reference_over_a_year(case: tuple[Spec, date]) -> None:
    spec, start = case
    schedule = parse_or_refused(spec, "UTC")
    if schedule is None:
        return
    stamp = datetime(start.year, start.month, start.day, tzinfo=UTC)
    lo = int(stamp.timestamp() * 1000)
    hi = lo + 400 * 86_400_000
    expected = [
        lo + i * 86_400_000 for i in range(1, 401) if spec.day_matches(start + timedelta(days=i))
    ]
    assert schedule.due_between(lo, hi) == expected


DOM_RULES = (
    [("L", ("L", 0)), ("LW", ("LW", 0))]
    + [(f"L-{n}", ("L", n)) for n in range(1, 31)]
    + [(f"{n}W", ("W", n)) for n in range(1, 32)]
)
DOW_RULES = [(f"{w}L", ("WL", w)) for w in range(8)] + [
    (f"{w}#{k}", ("#", (w, k))) for w in range(8) for k in range(1, 6)
]


@pytest.mark.parametrize(
    ("text", "rule", "day_field"),
    [(text, rule, "dom") for text, rule in DOM_RULES]
    + [(text, rule, "dow") for text, rule in DOW_RULES],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_every_day_rule_in_every_month_shape(text: str, rule: DayRule, day_field: str) -> None:
    """2000-2027 holds every month length starting on every weekday: exhaustive per rule."""
    expr = f"0 0 {text} * *" if day_field == "dom" else f"0 0 * * {text}"
    first = date(2000, 1, 1)
    expected = [
        int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp() * 1000)
        for d in (first + timedelta(days=i) for i in range((date(2028, 1, 1) - first).days))
        if rule_matches(rule, d)
    ]
    schedule = Schedule.parse(expr)
    assert schedule.due_between(expected[0] - 1, expected[-1]) == expected


@settings(FAST, max_examples=100)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(
        [
            "0 0 29 2 *",
            "0 12 13 * 5",
            "30 2 * * 0",
            "0 0 31 * *",
            "@monthly",
            "30 2 L * *",
            "0 9 * * 1#2",
            "15 1 31W * *",
            "0 0 * 2 0#5",
            "30 2 * * 0L",
            "H H * * *",
        ]
    ),
    st.integers(1_700_000_000_000, 1_900_000_000_000),
)
def test_iteration_is_strictly_increasing_and_consistent(tz: str, expr: str, start: int) -> None:
    schedule = Schedule.parse(expr, tz, job="reports.daily")
    dues = []
    for due in schedule.iter_after(start):
        dues.append(due)
        if len(dues) == 6:
            break
    assert dues[0] == schedule.next_after(start)
    assert all(a < b for a, b in pairwise(dues))
    assert all(schedule.next_after(a) == b for a, b in pairwise(dues))
    assert schedule.due_between(start, dues[-1]) == dues
