"""Schedules: field syntax, the day rule, the DST policy in many zones, @every, errors, jitter.

Expected instants are written in UTC with the local wall time they stand for in the row's id, so
each row can be checked against the zone's published transitions by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import islice, pairwise

import pytest
import xxhash

from hrwcron.core.errors import ScheduleError
from hrwcron.core.schedule import Schedule, jitter_ms, parse_duration
from hrwcron.core.ticks import format_ms, to_ms


def ms(text: str) -> int:
    return to_ms(datetime.fromisoformat(text))


def upcoming(expr: str, tz: str, after: str, count: int) -> list[str]:
    stream = Schedule.parse(expr, tz).iter_after(ms(after))
    return [format_ms(t) for t in islice(stream, count)]


def iso(*texts: str) -> list[str]:
    return [format_ms(ms(t)) for t in texts]


# --- DST policy ------------------------------------------------------------------------------
# Transitions in 2026 (tzdata): New York 03-08 07:00Z (02:00 EST -> 03:00 EDT) and 11-01 06:00Z
# (02:00 EDT -> 01:00 EST); London 03-29 01:00Z and 10-25 01:00Z; Berlin the same instants at
# 02:00 -> 03:00 and 03:00 -> 02:00 local; Sydney 04-04 16:00Z (03:00 AEDT -> 02:00 AEST) and
# 10-03 16:00Z (02:00 AEST -> 03:00 AEDT); Lord Howe 04-04 15:00Z (02:00 +11 -> 01:30 +10:30) and
# 10-03 15:30Z (02:00 +10:30 -> 02:30 +11); Chatham 04-04 14:00Z (03:45 +13:45 -> 02:45 +12:45)
# and 09-26 14:00Z (02:45 +12:45 -> 03:45 +13:45); Santiago 04-05 03:00Z (24:00 -03 -> 23:00 -04)
# and 09-06 04:00Z (00:00 -04 -> 01:00 -03). Kolkata has no DST.

DST_ROWS = [
    # The DST policy's own examples (docs/schedules.md), America/New_York.
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00Z", "2026-03-09T06:30Z"],
        id="ny-spring-fixed-02:30-fires-at-03:00EDT",
    ),
    pytest.param(
        "0 2,3 * * *",
        "America/New_York",
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00Z", "2026-03-09T06:00Z", "2026-03-09T07:00Z"],
        id="ny-spring-fixed-02:00-and-03:00-are-one-tick",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30Z", "2026-11-02T06:30Z"],
        id="ny-fall-fixed-01:30-first-pass-only",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T04:50Z",
        [f"2026-11-01T{h:02d}:{m:02d}Z" for h in (5, 6) for m in (0, 15, 30, 45)]
        + ["2026-11-01T07:00Z"],
        id="ny-fall-interval-both-passes",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:40Z",
        ["2026-03-08T06:45Z", "2026-03-08T07:00Z", "2026-03-08T07:15Z"],
        id="ny-spring-interval-skips-02:xx",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T04:30Z",
        ["2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"],
        id="ny-fall-hourly-01:00EDT-01:00EST-02:00EST",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-10-31T12:00Z",
        ["2026-11-01T07:30Z", "2026-11-02T07:30Z"],
        id="ny-fall-fixed-outside-repeated-hour-unaffected",
    ),
    pytest.param(
        "0 30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00Z", "2026-03-09T06:30Z"],
        id="ny-spring-six-field-fixed",
    ),
    pytest.param(
        "15 30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00Z",
        ["2026-03-08T07:00:00Z", "2026-03-09T06:30:15Z"],
        id="ny-spring-skipped-second-fires-as-gap-ends",
    ),
    pytest.param(
        "*/30 30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00Z",
        ["2026-11-01T05:30:00Z", "2026-11-01T05:30:30Z", "2026-11-02T06:30:00Z"],
        id="ny-fall-seconds-step-is-still-fixed-time",
    ),
    # Europe/London: gap 01:00-02:00, repeat 01:00-02:00.
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z", "2026-03-30T00:30Z"],
        id="london-spring-fixed-01:30-fires-at-02:00BST",
    ),
    pytest.param(
        "*/20 * * * *",
        "Europe/London",
        "2026-03-29T00:30Z",
        ["2026-03-29T00:40Z", "2026-03-29T01:00Z", "2026-03-29T01:20Z"],
        id="london-spring-interval-00:40GMT-02:00BST",
    ),
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30Z", "2026-10-26T01:30Z"],
        id="london-fall-fixed-01:30BST-only",
    ),
    pytest.param(
        "30 * * * *",
        "Europe/London",
        "2026-10-24T23:00Z",
        ["2026-10-24T23:30Z", "2026-10-25T00:30Z", "2026-10-25T01:30Z", "2026-10-25T02:30Z"],
        id="london-fall-interval-01:30BST-and-01:30GMT",
    ),
    # Europe/Berlin: gap 02:00-03:00, repeat 02:00-03:00.
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z", "2026-03-30T00:30Z"],
        id="berlin-spring-fixed-02:30-fires-at-03:00CEST",
    ),
    pytest.param(
        "0 2-3 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00Z",
        ["2026-03-29T01:00Z", "2026-03-30T00:00Z", "2026-03-30T01:00Z"],
        id="berlin-spring-fixed-02:00-and-03:00-are-one-tick",
    ),
    pytest.param(
        "15,45 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:00Z",
        ["2026-03-29T00:15Z", "2026-03-29T00:45Z", "2026-03-29T01:15Z"],
        id="berlin-spring-interval-01:45CET-03:15CEST",
    ),
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00Z",
        ["2026-10-25T00:30Z", "2026-10-26T01:30Z"],
        id="berlin-fall-fixed-02:30CEST-only",
    ),
    pytest.param(
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00Z",
        [
            "2026-10-25T00:00Z",
            "2026-10-25T00:30Z",
            "2026-10-25T01:00Z",
            "2026-10-25T01:30Z",
            "2026-10-26T01:00Z",
        ],
        id="berlin-fall-minute-star-is-interval-like",
    ),
    # Australia/Sydney: repeat 02:00-03:00 in April, gap 02:00-03:00 in October.
    pytest.param(
        "30 2 * * *",
        "Australia/Sydney",
        "2026-04-04T00:00Z",
        ["2026-04-04T15:30Z", "2026-04-05T16:30Z"],
        id="sydney-fall-fixed-02:30AEDT-only",
    ),
    pytest.param(
        "*/30 * * * *",
        "Australia/Sydney",
        "2026-04-04T14:45Z",
        [
            "2026-04-04T15:00Z",
            "2026-04-04T15:30Z",
            "2026-04-04T16:00Z",
            "2026-04-04T16:30Z",
            "2026-04-04T17:00Z",
        ],
        id="sydney-fall-interval-both-passes",
    ),
    pytest.param(
        "30 2 * * *",
        "Australia/Sydney",
        "2026-10-03T00:00Z",
        ["2026-10-03T16:00Z", "2026-10-04T15:30Z"],
        id="sydney-spring-fixed-02:30-fires-at-03:00AEDT",
    ),
    pytest.param(
        "0 * * * *",
        "Australia/Sydney",
        "2026-10-03T14:30Z",
        ["2026-10-03T15:00Z", "2026-10-03T16:00Z", "2026-10-03T17:00Z"],
        id="sydney-spring-interval-01:00AEST-03:00AEDT",
    ),
    # Australia/Lord_Howe: 30-minute shifts; repeat 01:30-02:00, gap 02:00-02:30.
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00Z",
        ["2026-04-04T14:45Z", "2026-04-05T15:15Z"],
        id="lordhowe-fall-fixed-01:45+11-only",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T14:20Z",
        [
            "2026-04-04T14:30Z",
            "2026-04-04T14:45Z",
            "2026-04-04T15:00Z",
            "2026-04-04T15:15Z",
            "2026-04-04T15:30Z",
        ],
        id="lordhowe-fall-interval-both-passes",
    ),
    pytest.param(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00Z",
        ["2026-10-03T15:30Z", "2026-10-04T15:15Z"],
        id="lordhowe-spring-fixed-02:15-fires-at-02:30+11",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00Z",
        ["2026-10-03T15:15Z", "2026-10-03T15:30Z", "2026-10-03T15:45Z"],
        id="lordhowe-spring-interval-skips-02:00-02:15",
    ),
    # Pacific/Chatham: +12:45/+13:45; repeat 02:45-03:45, gap 02:45-03:45.
    pytest.param(
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-04-04T00:00Z",
        ["2026-04-04T13:15Z", "2026-04-05T14:15Z"],
        id="chatham-fall-fixed-03:00+1345-only",
    ),
    pytest.param(
        "0 * * * *",
        "Pacific/Chatham",
        "2026-04-04T13:00Z",
        ["2026-04-04T13:15Z", "2026-04-04T14:15Z", "2026-04-04T15:15Z"],
        id="chatham-fall-interval-03:00-twice",
    ),
    pytest.param(
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-09-26T00:00Z",
        ["2026-09-26T14:00Z", "2026-09-27T13:15Z"],
        id="chatham-spring-fixed-03:00-fires-at-03:45+1345",
    ),
    pytest.param(
        "30 * * * *",
        "Pacific/Chatham",
        "2026-09-26T13:00Z",
        ["2026-09-26T13:45Z", "2026-09-26T14:45Z"],
        id="chatham-spring-interval-skips-03:30",
    ),
    # America/Santiago: transitions at midnight; repeat 23:00-24:00, gap 00:00-01:00.
    pytest.param(
        "30 23 * * *",
        "America/Santiago",
        "2026-04-04T12:00Z",
        ["2026-04-05T02:30Z", "2026-04-06T03:30Z"],
        id="santiago-fall-fixed-23:30-03-only",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/Santiago",
        "2026-04-05T01:50Z",
        [
            "2026-04-05T02:00Z",
            "2026-04-05T02:30Z",
            "2026-04-05T03:00Z",
            "2026-04-05T03:30Z",
            "2026-04-05T04:00Z",
        ],
        id="santiago-fall-interval-both-passes",
    ),
    pytest.param(
        "0 0 * * *",
        "America/Santiago",
        "2026-09-05T12:00Z",
        ["2026-09-06T04:00Z", "2026-09-07T03:00Z"],
        id="santiago-spring-midnight-fires-at-01:00-03",
    ),
    pytest.param(
        "30 0 * * 0",
        "America/Santiago",
        "2026-09-01T00:00Z",
        ["2026-09-06T04:00Z", "2026-09-13T03:30Z"],
        id="santiago-spring-sunday-00:30-keeps-its-day",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/Santiago",
        "2026-09-06T03:10Z",
        ["2026-09-06T03:30Z", "2026-09-06T04:00Z", "2026-09-06T04:30Z"],
        id="santiago-spring-interval-skips-00:xx",
    ),
    # Asia/Kolkata: +05:30 all year, nothing special on other zones' transition days.
    pytest.param(
        "30 2 * * *",
        "Asia/Kolkata",
        "2026-03-07T12:00Z",
        ["2026-03-07T21:00Z", "2026-03-08T21:00Z"],
        id="kolkata-march-fixed",
    ),
    pytest.param(
        "0 * * * *",
        "Asia/Kolkata",
        "2026-11-01T04:45Z",
        ["2026-11-01T05:30Z", "2026-11-01T06:30Z"],
        id="kolkata-november-interval",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), DST_ROWS)
def test_dst_policy(expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, tz, after, len(expected)) == iso(*expected)


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), DST_ROWS)
def test_due_between_agrees_with_iteration(
    expr: str, tz: str, after: str, expected: list[str]
) -> None:
    schedule = Schedule.parse(expr, tz)
    start, end = ms(after), ms(expected[-1])
    assert [format_ms(t) for t in schedule.due_between(start, end)] == iso(*expected)


def test_fall_back_fixed_time_fires_once_per_day() -> None:
    schedule = Schedule.parse("30 1 * * *", "America/New_York")
    day = schedule.due_between(ms("2026-11-01T00:00Z"), ms("2026-11-02T00:00Z"))
    assert day == [ms("2026-11-01T05:30Z")]


def test_interval_like_fires_every_real_quarter_hour_through_the_repeat() -> None:
    schedule = Schedule.parse("*/15 * * * *", "America/New_York")
    dues = schedule.due_between(ms("2026-11-01T04:00Z"), ms("2026-11-01T08:00Z"))
    assert len(dues) == 16
    assert {b - a for a, b in pairwise(dues)} == {15 * 60_000}


# --- calendar and field syntax ---------------------------------------------------------------

CALENDAR_ROWS = [
    pytest.param(
        "0 0 29 2 *",
        "2026-03-01T00:00Z",
        ["2028-02-29T00:00Z", "2032-02-29T00:00Z"],
        id="leap-day",
    ),
    pytest.param("0 0 29 2 *", "2096-03-01T00:00Z", ["2104-02-29T00:00Z"], id="2100-no-leap"),
    pytest.param("0 0 29 2 *", "2000-01-01T00:00Z", ["2000-02-29T00:00Z"], id="2000-is-leap"),
    pytest.param(
        "0 12 13 * 5",
        "2026-01-01T00:00Z",
        [
            "2026-01-02T12:00Z",
            "2026-01-09T12:00Z",
            "2026-01-13T12:00Z",
            "2026-01-16T12:00Z",
            "2026-01-23T12:00Z",
        ],
        id="both-days-restricted-the-13th-or-a-friday",
    ),
    pytest.param(
        "0 12 */2 * 5",
        "2026-01-01T00:00Z",
        ["2026-01-09T12:00Z", "2026-01-23T12:00Z", "2026-02-13T12:00Z"],
        id="star-step-day-of-month-is-not-restricted-so-and",
    ),
    pytest.param(
        "0 12 13 * *",
        "2026-01-01T00:00Z",
        ["2026-01-13T12:00Z", "2026-02-13T12:00Z"],
        id="day-of-month-only",
    ),
    pytest.param(
        "0 12 * * 5",
        "2026-01-01T00:00Z",
        ["2026-01-02T12:00Z", "2026-01-09T12:00Z"],
        id="day-of-week-only",
    ),
    pytest.param(
        "0 0 31 * *",
        "2026-01-31T00:00Z",
        ["2026-03-31T00:00Z", "2026-05-31T00:00Z"],
        id="31st-skips-short-months",
    ),
    pytest.param("0 0 * * 7", "2026-01-01T00:00Z", ["2026-01-04T00:00Z"], id="seven-is-sunday"),
    pytest.param(
        "0 0 * * 5-7",
        "2026-01-01T00:00Z",
        ["2026-01-02T00:00Z", "2026-01-03T00:00Z", "2026-01-04T00:00Z", "2026-01-09T00:00Z"],
        id="range-to-seven",
    ),
    pytest.param(
        "0 0 * * SAT-SUN",
        "2026-01-01T00:00Z",
        ["2026-01-03T00:00Z", "2026-01-04T00:00Z", "2026-01-10T00:00Z"],
        id="names-sat-sun",
    ),
    pytest.param(
        "0 9 * jan,Jul mon-fri",
        "2026-01-30T12:00Z",
        ["2026-07-01T09:00Z", "2026-07-02T09:00Z", "2026-07-03T09:00Z", "2026-07-06T09:00Z"],
        id="names-any-case",
    ),
    pytest.param(
        "5/20 8-10/2 * * *",
        "2026-01-01T00:00Z",
        ["2026-01-01T08:05Z", "2026-01-01T08:25Z", "2026-01-01T08:45Z", "2026-01-01T10:05Z"],
        id="start-step-and-range-step",
    ),
    pytest.param(
        "0,30 23 31 12 *",
        "2026-06-01T00:00Z",
        ["2026-12-31T23:00Z", "2026-12-31T23:30Z", "2027-12-31T23:00Z"],
        id="year-rollover",
    ),
    pytest.param(
        "30 * * * * *",
        "2026-01-01T00:00Z",
        ["2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z"],
        id="six-fields-seconds-first",
    ),
    pytest.param(
        "*/20 0 12 * * *",
        "2026-01-01T00:00Z",
        [
            "2026-01-01T12:00:00Z",
            "2026-01-01T12:00:20Z",
            "2026-01-01T12:00:40Z",
            "2026-01-02T12:00:00Z",
        ],
        id="six-fields-second-step",
    ),
    pytest.param("0 0 0 1 1 *", "2026-06-01T00:00Z", ["2027-01-01T00:00Z"], id="six-fields-yearly"),
    pytest.param("@yearly", "2026-06-01T00:00Z", ["2027-01-01T00:00Z"], id="yearly"),
    pytest.param("@annually", "2026-06-01T00:00Z", ["2027-01-01T00:00Z"], id="annually"),
    pytest.param("@monthly", "2026-06-15T00:00Z", ["2026-07-01T00:00Z"], id="monthly"),
    pytest.param(
        "@weekly", "2026-01-01T00:00Z", ["2026-01-04T00:00Z", "2026-01-11T00:00Z"], id="weekly"
    ),
    pytest.param("@daily", "2026-01-01T00:00Z", ["2026-01-02T00:00Z"], id="daily"),
    pytest.param("@midnight", "2026-01-01T00:00Z", ["2026-01-02T00:00Z"], id="midnight"),
    pytest.param(
        "@hourly", "2026-01-01T00:30Z", ["2026-01-01T01:00Z", "2026-01-01T02:00Z"], id="hourly"
    ),
    pytest.param("@DAILY", "2026-01-01T00:00Z", ["2026-01-02T00:00Z"], id="macro-any-case"),
]


@pytest.mark.parametrize(("expr", "after", "expected"), CALENDAR_ROWS)
def test_calendar(expr: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, "UTC", after, len(expected)) == iso(*expected)


def test_macros_follow_the_zone() -> None:
    assert upcoming("@daily", "Asia/Kolkata", "2026-01-01T00:00Z", 1) == iso("2026-01-01T18:30Z")


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("30 2 * * *", True),
        ("0-59 2 * * *", True),
        ("*/10 30 2 * * *", True),
        ("0 2,3 * * 1-5", True),
        ("@daily", True),
        ("@weekly", True),
        ("*/15 * * * *", False),
        ("0 * * * *", False),
        ("* 2 * * *", False),
        ("0 */2 * * *", False),
        ("0 0 * * * *", False),
        ("@hourly", False),
        ("@every 5m", False),
    ],
)
def test_fixed_time_classification(expr: str, fixed: bool) -> None:
    assert Schedule.parse(expr).fixed_time is fixed


# --- @every ------------------------------------------------------------------------------------

EVERY_ROWS = [
    pytest.param("@every 90s", 100_000, [180_000, 270_000], id="90s-from-100000"),
    pytest.param("@every 90s", 180_000, [270_000], id="strictly-after-a-tick"),
    pytest.param("@every 90s", 179_999, [180_000], id="just-before-a-tick"),
    pytest.param("@every 90s", -1, [0, 90_000], id="epoch-is-a-tick"),
    pytest.param("@every 1s", 1_500, [2_000, 3_000], id="one-second"),
    pytest.param("@every 1.5s", 0, [1_500, 3_000], id="fractional-seconds"),
    pytest.param("@every 1h30m", 0, [5_400_000, 10_800_000], id="compound"),
    pytest.param("@every 1001ms", 1_000, [1_001, 2_002], id="milliseconds"),
    pytest.param("@EVERY 5m", 1, [300_000], id="keyword-any-case"),
]


@pytest.mark.parametrize(("expr", "after", "expected"), EVERY_ROWS)
def test_every_is_anchored_at_the_epoch(expr: str, after: int, expected: list[int]) -> None:
    assert list(islice(Schedule.parse(expr).iter_after(after), len(expected))) == expected


def test_every_ignores_the_zone_even_across_dst() -> None:
    after = ms("2026-03-08T06:30Z")
    for tz in ("UTC", "America/New_York", "Pacific/Chatham"):
        schedule = Schedule.parse("@every 1h", tz)
        assert list(islice(schedule.iter_after(after), 2)) == [
            ms("2026-03-08T07:00Z"),
            ms("2026-03-08T08:00Z"),
        ]


def test_every_due_between() -> None:
    schedule = Schedule.parse("@every 90s")
    assert schedule.due_between(0, 270_000) == [90_000, 180_000, 270_000]
    assert schedule.due_between(90_000, 269_999) == [180_000]
    assert schedule.due_between(100, 100) == []


# --- instants and boundaries -----------------------------------------------------------------


def test_next_after_is_strictly_after() -> None:
    schedule = Schedule.parse("0 * * * *")
    due = ms("2026-01-01T10:00Z")
    assert schedule.next_after(due) == ms("2026-01-01T11:00Z")
    assert schedule.next_after(due - 1) == due


def test_due_between_excludes_start_includes_end() -> None:
    schedule = Schedule.parse("0 * * * *")
    start, end = ms("2026-01-01T10:00Z"), ms("2026-01-01T12:00Z")
    assert schedule.due_between(start, end) == [ms("2026-01-01T11:00Z"), end]
    assert schedule.due_between(start - 1, end - 1) == [start, ms("2026-01-01T11:00Z")]
    assert schedule.due_between(start, start) == []
    assert schedule.due_between(end, start) == []


def test_datetimes_and_milliseconds_agree() -> None:
    schedule = Schedule.parse("*/5 * * * *", "Europe/Berlin")
    as_utc = datetime(2026, 3, 29, 0, 58, 30, tzinfo=UTC)
    as_berlin = as_utc.astimezone(timezone(timedelta(hours=1)))
    expected = ms("2026-03-29T01:00Z")
    assert schedule.next_after(as_utc) == expected
    assert schedule.next_after(as_berlin) == expected
    assert schedule.next_after(to_ms(as_utc)) == expected
    assert schedule.due_between(as_berlin, as_utc + timedelta(minutes=7)) == [
        expected,
        ms("2026-03-29T01:05Z"),
    ]


def test_sub_millisecond_datetimes() -> None:
    schedule = Schedule.parse("* * * * * *")
    assert schedule.next_after(datetime(2026, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC)) == ms(
        "2026-01-01T00:00:01Z"
    )
    assert schedule.next_after(datetime(2026, 1, 1, 0, 0, 0, 500, tzinfo=UTC)) == ms(
        "2026-01-01T00:00:01Z"
    )


@pytest.mark.parametrize("call", ["next_after", "iter_after", "due_between"])
def test_naive_datetime_is_rejected(call: str) -> None:
    schedule = Schedule.parse("0 * * * *")
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(ScheduleError, match="naive datetime"):
        if call == "next_after":
            schedule.next_after(naive)
        elif call == "iter_after":
            next(schedule.iter_after(naive))
        else:
            schedule.due_between(naive, ms("2026-01-02T00:00Z"))


def test_instants_outside_the_supported_years_are_rejected() -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse("0 * * * *").next_after(ms("9500-01-01T00:00Z"))
    assert info.value.field == "instant"


def test_iter_after_is_lazy_and_ascending() -> None:
    stream = Schedule.parse("* * * * * *").iter_after(0)
    assert [next(stream) for _ in range(3)] == [1_000, 2_000, 3_000]


def test_parse_is_shared_and_schedules_are_values() -> None:
    a = Schedule.parse("0 * * * *", "UTC")
    assert Schedule.parse("0 * * * *", "UTC") is a
    assert Schedule.parse("0 * * * *") is a
    assert Schedule.parse("0 * * * *", "Europe/Berlin") != a
    assert len({a, Schedule.parse("0 * * * *", "UTC"), Schedule.parse("@hourly")}) == 2
    assert (a.expr, a.tz, a.fixed_time) == ("0 * * * *", "UTC", False)
    with pytest.raises(AttributeError):
        a.expr = "1 * * * *"  # type: ignore[misc]


def test_direct_construction_compiles_from_the_expression() -> None:
    built = Schedule("30 2 * * *", "America/New_York", False)
    assert built.fixed_time is True
    assert built == Schedule.parse("30 2 * * *", "America/New_York")
    assert built.next_after(ms("2026-03-07T12:00Z")) == ms("2026-03-08T07:00Z")
    with pytest.raises(ScheduleError):
        Schedule("61 * * * *", "UTC", False)


def test_memoised_answers_stay_right() -> None:
    schedule = Schedule.parse("0 * * * *", "America/New_York")
    start = ms("2026-11-01T00:00Z")
    first = [schedule.next_after(start + i * 600_000) for i in range(60)]
    again = [schedule.next_after(start + i * 600_000) for i in range(60)]
    assert first == again
    assert first == [next(schedule.iter_after(start + i * 600_000)) for i in range(60)]


# --- errors ------------------------------------------------------------------------------------

ERROR_ROWS = [
    pytest.param("", "UTC", "expression", "empty", id="empty"),
    pytest.param("   ", "UTC", "expression", "empty", id="blank"),
    pytest.param("* * * *", "UTC", "expression", "got 4", id="four-fields"),
    pytest.param("* * * * * * *", "UTC", "expression", "got 7", id="seven-fields"),
    pytest.param("@fortnightly", "UTC", "expression", "unknown macro", id="unknown-macro"),
    pytest.param("@daily 5", "UTC", "expression", "takes no fields", id="macro-with-fields"),
    pytest.param("@every", "UTC", "duration", "one duration", id="every-without-duration"),
    pytest.param("@every 1m 2m", "UTC", "duration", "one duration", id="every-two-durations"),
    pytest.param("@every 0s", "UTC", "duration", "minimum of 1s", id="every-zero"),
    pytest.param("@every 500ms", "UTC", "duration", "minimum of 1s", id="every-too-short"),
    pytest.param("@every 1.0005s", "UTC", "duration", "whole number of milli", id="every-sub-ms"),
    pytest.param("@every 5", "UTC", "duration", "not a duration", id="every-no-unit"),
    pytest.param("@every 5d", "UTC", "duration", "not a duration", id="every-bad-unit"),
    pytest.param("@every -5m", "UTC", "duration", "not a duration", id="every-negative"),
    pytest.param("60 * * * *", "UTC", "minute", "60 is out of range 0-59", id="minute-60"),
    pytest.param("61 * * * *", "UTC", "minute", "61 is out of range 0-59", id="minute-61"),
    pytest.param("*/0 * * * *", "UTC", "minute", "step 0", id="step-zero"),
    # Hundreds of digits: the field names the problem, not a traceback from int().
    pytest.param("0" * 1000 + " * * * *", "UTC", "minute", "out of range", id="huge-number"),
    pytest.param("*/" + "9" * 1000 + " * * * *", "UTC", "minute", "too large", id="huge-step"),
    # Longer than any schedule may be: refused before any field is read.
    pytest.param("0" * 5000 + " * * * *", "UTC", "expression", "at most", id="too-long"),
    pytest.param("*/x * * * *", "UTC", "minute", "not a number", id="step-not-a-number"),
    pytest.param("5-2 * * * *", "UTC", "minute", "runs backwards", id="backwards-range"),
    pytest.param("1-2-3 * * * *", "UTC", "minute", "not a range", id="double-range"),
    pytest.param("5- * * * *", "UTC", "minute", "value is missing", id="open-range"),
    pytest.param("/5 * * * *", "UTC", "minute", "value is missing", id="step-without-start"),
    pytest.param(
        "0 0 * WED *", "UTC", "month", "'WED' is not a number or a name", id="dow-in-month"
    ),
    pytest.param("1,,2 * * * *", "UTC", "minute", "empty item", id="empty-list-item"),
    pytest.param("1, * * * *", "UTC", "minute", "empty item", id="trailing-comma"),
    pytest.param("a * * * *", "UTC", "minute", "'a' is not a number", id="minute-letter"),
    pytest.param("0 24 * * *", "UTC", "hour", "24 is out of range 0-23", id="hour-24"),
    pytest.param("0 \uff11 * * *", "UTC", "hour", "not allowed", id="fullwidth-digit"),
    pytest.param("0 0 0 * *", "UTC", "day-of-month", "0 is out of range 1-31", id="dom-0"),
    pytest.param("0 0 32 * *", "UTC", "day-of-month", "32 is out of range", id="dom-32"),
    pytest.param("0 0 31 2 *", "UTC", "day-of-month", "never fires", id="feb-31"),
    pytest.param("0 0 30,31 2 *", "UTC", "day-of-month", "never fires", id="feb-30-31"),
    pytest.param("0 0 31 4,6,9,11 *", "UTC", "day-of-month", "never fires", id="short-31"),
    pytest.param("0 0 31 2 */2", "UTC", "day-of-month", "never fires", id="feb-31-and-dow"),
    pytest.param("0 0 0 31 2 *", "UTC", "day-of-month", "never fires", id="six-field-feb-31"),
    pytest.param("0 0 * 13 *", "UTC", "month", "13 is out of range 1-12", id="month-13"),
    pytest.param("0 0 * 0 *", "UTC", "month", "0 is out of range 1-12", id="month-0"),
    pytest.param("0 0 * foo *", "UTC", "month", "not a number or a name", id="month-name"),
    pytest.param("0 0 * * 8", "UTC", "day-of-week", "8 is out of range 0-7", id="dow-8"),
    pytest.param("0 0 * * jan", "UTC", "day-of-week", "'jan' is not", id="month-name-in-dow"),
    pytest.param("0 0 * * SAT-MON", "UTC", "day-of-week", "runs backwards", id="dow-backwards"),
    pytest.param("60 0 0 * * *", "UTC", "second", "60 is out of range 0-59", id="second-60"),
    pytest.param(
        "0 * * * *", "Mars/Olympus", "tz", "'Mars/Olympus' is not an IANA time zone", id="tz"
    ),
    pytest.param("0 * * * *", "", "tz", "empty", id="tz-empty"),
    pytest.param("0 * * * *", "../../etc/passwd", "tz", "not an IANA", id="tz-path"),
    pytest.param("0 * * * *", "EST+5", "tz", "not an IANA", id="tz-posix-string"),
    pytest.param("@every 5m", "Nowhere/Land", "tz", "not an IANA", id="tz-checked-for-every"),
]


@pytest.mark.parametrize(("expr", "tz", "where", "fragment"), ERROR_ROWS)
def test_errors_name_the_field(expr: str, tz: str, where: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse(expr, tz)
    [problem] = info.value.problems
    assert problem.where == where
    assert fragment in problem.message


def test_error_text_reads_field_first() -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse("61 * * * *")
    assert str(info.value) == "minute: 61 is out of range 0-59"


def test_non_string_expression_is_a_schedule_error() -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse(None)  # type: ignore[arg-type]
    assert info.value.field == "expression"


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("2h", 7200.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("0s", 0.0),
        (" 10s ", 10.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "90", "5x", "m", "1h 30m", "-5s", "5M", "1..5s", ".5s", "5s!", "1h30"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_duration(text)
    assert info.value.field == "duration"


# --- jitter ------------------------------------------------------------------------------------


def test_jitter_vectors() -> None:
    # Published so another implementation can check itself: xxh3_64(utf8(job)) mod (jitter ms).
    assert jitter_ms("billing.nightly", 30) == 28566
    assert jitter_ms("reports.daily", 1.5) == 975
    assert jitter_ms("billing.nightly", 30) == xxhash.xxh3_64_intdigest(b"billing.nightly") % 30_000


def test_jitter_is_deterministic_and_in_range() -> None:
    names = [f"job-{i}.run" for i in range(2_000)]
    values = [jitter_ms(name, 10) for name in names]
    assert values == [jitter_ms(name, 10.0) for name in names]
    assert all(0 <= v < 10_000 for v in values)
    # Spread over the whole window, not bunched at one end.
    assert min(values) < 500 and max(values) > 9_500
    assert len(set(values)) > 1_500


@pytest.mark.parametrize("jitter", [0, 0.0, 0.0004])
def test_no_jitter(jitter: float) -> None:
    assert jitter_ms("billing.nightly", jitter) == 0


@pytest.mark.parametrize("jitter", [-1.0, float("nan"), float("inf")])
def test_bad_jitter(jitter: float) -> None:
    with pytest.raises(ScheduleError) as info:
        jitter_ms("billing.nightly", jitter)
    assert info.value.field == "jitter"
