"""Forms people bring from Quartz, EventBridge, Jenkins and croniter: L, L-n, nW, LW, nL, n#k,
'?', H and steps wider than their field, table by table.

Weekdays of the months used below (checked against any calendar): 2026-01 starts on a Thursday
and ends on a Saturday (31 days); 2026-02 starts and ends on a Sunday/Saturday (28); 2026-03
starts on a Sunday and ends on a Tuesday; 2026-04 Wednesday to Thursday (30); 2026-05 Friday to
Sunday (31); 2026-07 Wednesday to Friday; 2026-08 starts on a Saturday; 2026-11 starts on a
Sunday; 2028-02 has 29 days, Tuesday to Tuesday; 2032-02 has 29 days, Sunday to Sunday.
"""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from itertools import islice
from pathlib import Path

import pytest
import xxhash

from hrwcron.core.errors import ScheduleError
from hrwcron.core.hrw import score
from hrwcron.core.model import JobSpec
from hrwcron.core.schedule import Schedule, field_hash
from hrwcron.core.ticks import format_ms, to_ms


def ms(text: str) -> int:
    return to_ms(datetime.fromisoformat(text))


def upcoming(
    expr: str, after: str, count: int, tz: str = "UTC", job: str | None = None
) -> list[str]:
    stream = Schedule.parse(expr, tz, job=job).iter_after(ms(after))
    return [format_ms(t) for t in islice(stream, count)]


def iso(*texts: str) -> list[str]:
    return [format_ms(ms(t)) for t in texts]


def midnights(*days: str) -> list[str]:
    return [f"{day}T00:00Z" for day in days]


# --- day of month --------------------------------------------------------------------------

DOM_ROWS = [
    pytest.param(
        "0 0 L * *",
        "2026-01-15T00:00Z",
        midnights("2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30"),
        id="L-months-of-31-28-31-30",
    ),
    pytest.param(
        "0 0 L 2 *",
        "2027-06-01T00:00Z",
        midnights("2028-02-29", "2029-02-28"),
        id="L-february-leap-then-common",
    ),
    pytest.param("0 0 L 2 *", "2099-06-01T00:00Z", midnights("2100-02-28"), id="L-2100-no-leap"),
    pytest.param("0 0 L 2 *", "1999-06-01T00:00Z", midnights("2000-02-29"), id="L-2000-is-leap"),
    pytest.param(
        "0 0 L-2 * *",
        "2028-01-31T00:00Z",
        midnights("2028-02-27", "2028-03-29", "2028-04-28"),
        id="L-2-in-29-31-30-day-months",
    ),
    pytest.param(
        "0 0 L-30 * *",
        "2026-01-15T00:00Z",
        midnights("2026-03-01", "2026-05-01", "2026-07-01", "2026-08-01"),
        id="L-30-is-the-1st-of-31-day-months-only",
    ),
    pytest.param(
        "0 0 L-27 2 *",
        "2027-06-01T00:00Z",
        midnights("2028-02-02", "2029-02-01"),
        id="L-27-february-leap-and-common",
    ),
    pytest.param(
        "0 0 15W * *",
        "2026-02-01T00:00Z",
        midnights("2026-02-16", "2026-03-16", "2026-04-15"),
        id="15W-sunday-moves-to-monday-weekday-stays",
    ),
    pytest.param(
        "0 0 15W * *", "2026-08-01T00:00Z", midnights("2026-08-14"), id="15W-saturday-to-friday"
    ),
    pytest.param(
        "0 0 1W * *",
        "2026-07-15T00:00Z",
        midnights("2026-08-03", "2026-09-01"),
        id="1W-month-starting-on-saturday-is-monday-3rd-not-july-31",
    ),
    pytest.param(
        "0 0 1W * *",
        "2026-10-15T00:00Z",
        midnights("2026-11-02"),
        id="1W-month-starting-on-sunday-is-monday-2nd",
    ),
    pytest.param(
        "0 0 31W * *",
        "2026-01-01T00:00Z",
        midnights("2026-01-30", "2026-03-31", "2026-05-29", "2026-07-31"),
        id="31W-saturday-and-sunday-stay-in-the-month-30-day-months-have-none",
    ),
    pytest.param(
        "0 0 30W * *",
        "2026-01-01T00:00Z",
        midnights("2026-01-30", "2026-03-30", "2026-04-30"),
        id="30W-february-has-none",
    ),
    pytest.param(
        "0 0 29W 2 *",
        "2028-03-01T00:00Z",
        midnights("2032-02-27", "2036-02-29"),
        id="29W-leap-february-ending-on-sunday-is-friday-27th",
    ),
    pytest.param(
        "0 0 LW * *",
        "2026-01-01T00:00Z",
        midnights("2026-01-30", "2026-02-27", "2026-03-31", "2026-04-30", "2026-05-29"),
        id="LW-saturday-and-sunday-ends-fall-back-to-friday",
    ),
    pytest.param("0 0 LW 2 *", "2031-06-01T00:00Z", midnights("2032-02-27"), id="LW-leap-feb"),
    pytest.param(
        "0 0 1,15,L * *",
        "2026-02-10T00:00Z",
        midnights("2026-02-15", "2026-02-28", "2026-03-01", "2026-03-15", "2026-03-31"),
        id="list-of-plain-days-and-L",
    ),
    pytest.param(
        "0 0 l,15w * *",
        "2026-02-10T00:00Z",
        midnights("2026-02-16", "2026-02-28"),
        id="lower-case",
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), DOM_ROWS)
def test_day_of_month_forms(expr: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, after, len(expected)) == iso(*expected)


# --- day of week -----------------------------------------------------------------------------

DOW_ROWS = [
    pytest.param(
        "0 9 * * 1#2",
        "2026-01-01T00:00Z",
        ["2026-01-12T09:00Z", "2026-02-09T09:00Z", "2026-03-09T09:00Z"],
        id="second-monday",
    ),
    pytest.param(
        "0 0 * * 5#5",
        "2026-01-01T00:00Z",
        midnights("2026-01-30", "2026-05-29", "2026-07-31", "2026-10-30"),
        id="5#5-months-without-a-fifth-friday-have-no-match",
    ),
    pytest.param(
        "0 0 * 2 0#5",
        "2026-01-01T00:00Z",
        midnights("2032-02-29"),
        id="fifth-sunday-of-february-needs-a-leap-year-starting-on-sunday",
    ),
    pytest.param(
        "0 0 * * FRI#1,mon#1",
        "2026-01-01T00:00Z",
        midnights("2026-01-02", "2026-01-05", "2026-02-02", "2026-02-06"),
        id="names-and-a-list",
    ),
    pytest.param(
        "0 0 * * 7#1",
        "2026-01-01T00:00Z",
        midnights("2026-01-04", "2026-02-01"),
        id="7-is-sunday-in-n#k",
    ),
    pytest.param(
        "0 0 * * 5L",
        "2026-01-01T00:00Z",
        midnights("2026-01-30", "2026-02-27", "2026-03-27", "2026-04-24"),
        id="last-friday",
    ),
    pytest.param(
        "0 0 * * 7L",
        "2026-01-01T00:00Z",
        midnights("2026-01-25", "2026-02-22", "2026-03-29"),
        id="last-sunday-as-7L",
    ),
    pytest.param(
        "0 0 * * SATL",
        "2026-01-01T00:00Z",
        midnights("2026-01-31", "2026-02-28"),
        id="last-saturday-by-name",
    ),
    pytest.param(
        "0 0 * * 1#1,5L",
        "2026-01-01T00:00Z",
        midnights("2026-01-05", "2026-01-30", "2026-02-02", "2026-02-27"),
        id="first-monday-and-last-friday",
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), DOW_ROWS)
def test_day_of_week_forms(expr: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, after, len(expected)) == iso(*expected)


# --- '?' and the day rule --------------------------------------------------------------------

DAY_RULE_ROWS = [
    pytest.param(
        "0 0 L * 5",
        "2026-01-25T00:00Z",
        midnights("2026-01-30", "2026-01-31", "2026-02-06"),
        id="both-restricted-last-day-or-any-friday",
    ),
    pytest.param(
        "0 0 15W * 1#1",
        "2026-02-01T00:00Z",
        midnights("2026-02-02", "2026-02-16", "2026-03-02", "2026-03-16"),
        id="both-restricted-15W-or-first-monday",
    ),
    pytest.param(
        "0 0 L * */2",
        "2026-06-15T00:00Z",
        midnights("2026-06-30", "2026-10-31"),
        id="star-step-day-of-week-is-not-restricted-so-and",
    ),
    pytest.param(
        "0 0 */2 * 5L",
        "2026-01-01T00:00Z",
        midnights("2026-02-27", "2026-03-27", "2026-05-29"),
        id="star-step-day-of-month-and-last-friday",
    ),
    pytest.param(
        "0 12 ? * MON",
        "2026-01-01T00:00Z",
        ["2026-01-05T12:00Z", "2026-01-12T12:00Z"],
        id="question-mark-day-of-month-means-every-day",
    ),
    pytest.param(
        "0 12 13 * ?",
        "2026-01-01T00:00Z",
        ["2026-01-13T12:00Z", "2026-02-13T12:00Z"],
        id="question-mark-day-of-week-leaves-the-13th-alone",
    ),
    pytest.param(
        "0 0 L * ?", "2026-01-15T00:00Z", midnights("2026-01-31", "2026-02-28"), id="L-and-?"
    ),
    pytest.param(
        "0 0 ? * 5L", "2026-01-01T00:00Z", midnights("2026-01-30", "2026-02-27"), id="?-and-5L"
    ),
    pytest.param(
        "0 12 ? * ?",
        "2026-01-01T00:00Z",
        ["2026-01-01T12:00Z", "2026-01-02T12:00Z"],
        id="both-question-marks",
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), DAY_RULE_ROWS)
def test_question_mark_and_the_day_rule(expr: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, after, len(expected)) == iso(*expected)


# --- steps wider than the field ----------------------------------------------------------------

WIDE_STEP_ROWS = [
    pytest.param(
        "0 */30 * * *",
        "2026-01-01T05:00Z",
        ["2026-01-02T00:00Z", "2026-01-03T00:00Z"],
        id="hours-every-30-is-hour-0",
    ),
    pytest.param(
        "*/90 * * * * *",
        "2026-01-01T00:00:30Z",
        ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"],
        id="seconds-every-90-is-second-0",
    ),
    pytest.param(
        "*/61 * * * *",
        "2026-01-01T00:30Z",
        ["2026-01-01T01:00Z", "2026-01-01T02:00Z"],
        id="minutes-every-61-is-minute-0",
    ),
    pytest.param(
        "5/90 * * * *",
        "2026-01-01T00:30Z",
        ["2026-01-01T01:05Z", "2026-01-01T02:05Z"],
        id="start-and-wide-step",
    ),
    pytest.param(
        "0 10-20/30 * * *",
        "2026-01-01T00:00Z",
        ["2026-01-01T10:00Z", "2026-01-02T10:00Z"],
        id="range-and-wide-step",
    ),
    pytest.param(
        "0 0 */40 * *",
        "2026-01-15T00:00Z",
        midnights("2026-02-01", "2026-03-01"),
        id="day-of-month-every-40-is-the-1st",
    ),
    pytest.param(
        "0 0 1 */13 *",
        "2026-02-01T00:00Z",
        midnights("2027-01-01", "2028-01-01"),
        id="month-every-13-is-january",
    ),
    pytest.param(
        "0 0 * * */7",
        "2026-01-01T00:00Z",
        midnights("2026-01-04", "2026-01-11"),
        id="day-of-week-every-7-is-sunday",
    ),
    pytest.param(
        "0 0 * * 1-5/9",
        "2026-01-01T00:00Z",
        midnights("2026-01-05", "2026-01-12"),
        id="weekday-range-and-wide-step-is-monday",
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), WIDE_STEP_ROWS)
def test_wide_steps_keep_the_first_value(expr: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, after, len(expected)) == iso(*expected)


# --- the DST policy applies to the new forms unchanged -----------------------------------------
# Transitions: Berlin 2024-03-31 and 2026-03-29 01:00Z (02:00 -> 03:00), 2026-10-25 01:00Z
# (03:00 -> 02:00); London 2024-03-31 01:00Z (01:00 -> 02:00); New York 2026-03-08 07:00Z and
# 2026-11-01 06:00Z; Sydney 2026-04-04 16:00Z (03:00 -> 02:00) and 2026-10-03 16:00Z (02:00 ->
# 03:00); Lord Howe 2026-10-03 15:30Z (02:00 +10:30 -> 02:30 +11); Chatham 2026-09-26 14:00Z
# (02:45 +12:45 -> 03:45 +13:45).

DST_ROWS = [
    pytest.param(
        "30 2 L * *",
        "Europe/Berlin",
        "2024-03-30T00:00Z",
        ["2024-03-31T01:00Z", "2024-04-30T00:30Z"],
        id="berlin-L-on-a-spring-forward-last-day-fires-once-after-the-gap",
    ),
    pytest.param(
        "30 1 L * *",
        "Europe/London",
        "2024-03-30T00:00Z",
        ["2024-03-31T01:00Z", "2024-04-30T00:30Z"],
        id="london-L-spring-forward",
    ),
    pytest.param(
        "30 2 * 3 0L",
        "Europe/Berlin",
        "2026-03-01T00:00Z",
        ["2026-03-29T01:00Z", "2027-03-28T01:00Z"],
        id="berlin-last-sunday-of-march-is-the-gap-day",
    ),
    pytest.param(
        "30 2 * 10 0L",
        "Europe/Berlin",
        "2026-10-24T00:00Z",
        ["2026-10-25T00:30Z", "2027-10-31T00:30Z"],
        id="berlin-last-sunday-of-october-fixed-first-pass-only",
    ),
    pytest.param(
        "*/30 2 * 10 0L",
        "Europe/Berlin",
        "2026-10-24T23:00Z",
        ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T01:00Z", "2026-10-25T01:30Z"],
        id="berlin-last-sunday-of-october-interval-both-passes",
    ),
    pytest.param(
        "30 2 * 3 0#2",
        "America/New_York",
        "2026-03-01T00:00Z",
        ["2026-03-08T07:00Z", "2027-03-14T07:00Z"],
        id="ny-second-sunday-of-march-02:30-fires-at-03:00EDT",
    ),
    pytest.param(
        "30 1 * 11 0#1",
        "America/New_York",
        "2026-10-01T00:00Z",
        ["2026-11-01T05:30Z", "2027-11-07T05:30Z"],
        id="ny-first-sunday-of-november-01:30-first-pass-only",
    ),
    pytest.param(
        "30 2 * 10 0#1",
        "Australia/Sydney",
        "2026-09-01T00:00Z",
        ["2026-10-03T16:00Z", "2027-10-02T16:00Z"],
        id="sydney-first-sunday-of-october-02:30-fires-at-03:00AEDT",
    ),
    pytest.param(
        "30 2 * 4 0#1",
        "Australia/Sydney",
        "2026-03-01T00:00Z",
        ["2026-04-04T15:30Z", "2027-04-03T15:30Z"],
        id="sydney-first-sunday-of-april-02:30-first-pass-only",
    ),
    pytest.param(
        "15 2 * 10 0#1",
        "Australia/Lord_Howe",
        "2026-09-01T00:00Z",
        ["2026-10-03T15:30Z", "2027-10-02T15:30Z"],
        id="lord-howe-half-hour-gap",
    ),
    pytest.param(
        "45 2 * 9 0L",
        "Pacific/Chatham",
        "2026-09-01T00:00Z",
        ["2026-09-26T14:00Z", "2027-09-25T14:00Z"],
        id="chatham-last-sunday-of-september",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), DST_ROWS)
def test_dst_policy_for_the_new_forms(expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, after, len(expected), tz) == iso(*expected)
    schedule = Schedule.parse(expr, tz)
    between = schedule.due_between(ms(after), ms(expected[-1]))
    assert [format_ms(t) for t in between] == iso(*expected)


# --- H ------------------------------------------------------------------------------------------


def documented_hash(job: str, field_name: str) -> int:
    """The derivation as docs/schedules.md states it, written out independently of the module."""
    return xxhash.xxh3_64_intdigest(job.encode("utf-8") + b"\x00" + field_name.encode("utf-8"))


def test_field_hash_is_the_documented_derivation_and_the_hrw_score() -> None:
    for job in ("reports.daily", "billing.nightly", "café", "ジョブ.毎日"):
        for name in ("second", "minute", "hour", "day-of-month", "month", "day-of-week"):
            assert field_hash(job, name) == documented_hash(job, name) == score(job, name)


def test_H_picks_each_field_from_its_own_hash() -> None:
    job = "reports.daily"
    minute = documented_hash(job, "minute") % 60
    hour = documented_hash(job, "hour") % 24
    expected = [f"2026-01-0{d}T{hour:02d}:{minute:02d}Z" for d in (2, 3, 4)]
    assert upcoming("H H * * *", "2026-01-01T23:59Z", 3, job=job) == iso(*expected)


@pytest.mark.parametrize(
    ("item", "field_name", "lo", "hi", "step"),
    [
        ("H", "minute", 0, 59, None),
        ("H(10-20)", "minute", 10, 20, None),
        ("H/15", "minute", 0, 59, 15),
        ("H(0-29)/10", "minute", 0, 29, 10),
        ("H(0-9)/30", "minute", 0, 9, 30),
    ],
)
def test_H_forms_in_the_minute_field(
    item: str, field_name: str, lo: int, hi: int, step: int | None
) -> None:
    for job in (f"job-{i}" for i in range(50)):
        h = documented_hash(job, field_name)
        span = hi - lo + 1
        if step is None:
            expected = [lo + h % span]
        else:
            expected = list(range(lo + h % min(step, span), hi + 1, step))
        schedule = Schedule.parse(f"{item} * * * *", job=job)
        dues = schedule.due_between(ms("2026-01-01T00:00Z") - 1, ms("2026-01-01T00:59Z"))
        assert [(t // 60_000) % 60 for t in dues] == expected, job


def test_H_in_day_of_month_stays_within_1_to_28_so_every_month_fires() -> None:
    days = set()
    for i in range(400):
        schedule = Schedule.parse("0 0 H * *", job=f"job-{i}")
        due = schedule.next_after(ms("2026-02-01T00:00Z") - 1)
        assert due < ms("2026-03-01T00:00Z")
        days.add(datetime.fromisoformat(format_ms(due)).day)
    assert days == set(range(1, 29))


@pytest.mark.parametrize(
    ("expr", "field_name", "values"),
    [
        ("0 H * * *", "hour", range(24)),
        ("0 0 1 H *", "month", range(1, 13)),
        ("0 0 * * H", "day-of-week", range(7)),
        ("H * * * * *", "second", range(60)),
        ("0 0 * * H(MON-FRI)", "day-of-week", range(1, 6)),
    ],
)
def test_H_covers_its_field_and_follows_the_hash(expr: str, field_name: str, values: range) -> None:
    seen = set()
    for i in range(300):
        job = f"team-{i}.sync"
        schedule = Schedule.parse(expr, job=job)
        due = schedule.next_after(ms("2026-01-01T00:00Z"))
        stamp = datetime.fromisoformat(format_ms(due))
        got = {
            "hour": stamp.hour,
            "month": stamp.month,
            "day-of-week": stamp.isoweekday() % 7,
            "second": stamp.second,
        }[field_name]
        assert got == values[documented_hash(job, field_name) % len(values)], job
        seen.add(got)
    assert seen == set(values)


def test_H_spreads_an_hourly_herd_and_is_stable_per_job() -> None:
    jobs = [f"tenant-{i}.poll" for i in range(600)]
    minutes = [Schedule.parse("H * * * *", job=j).next_after(0) // 60_000 % 60 for j in jobs]
    assert minutes == [
        Schedule.parse("H * * * *", job=j).next_after(0) // 60_000 % 60 for j in jobs
    ]
    counts = [minutes.count(m) for m in range(60)]
    assert min(counts) >= 1 and max(counts) <= 25  # 10 per minute on average


def test_H_schedules_belong_to_their_job_and_plain_ones_are_shared() -> None:
    a = Schedule.parse("H * * * *", job="a")
    assert Schedule.parse("H * * * *", job="a") is a
    assert a.job == "a" and a != Schedule.parse("H * * * *", job="b")
    plain = Schedule.parse("0 * * * *")
    assert Schedule.parse("0 * * * *", job="a") is plain
    assert plain.job is None
    built = Schedule("H 2 * * *", "UTC", False, "a")
    assert built.fixed_time is True
    assert built.next_after(0) == Schedule.parse("H 2 * * *", job="a").next_after(0)


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("H H * * *", True),
        ("H 2 * * *", True),
        ("0 0 L * *", True),
        ("30 2 * * 5#2", True),
        ("H * * * *", False),
        ("H/15 * * * *", False),
        ("*/15 H * * *", False),
        ("0 */30 * * *", False),
    ],
)
def test_fixed_time_classification_of_the_new_forms(expr: str, fixed: bool) -> None:
    assert Schedule.parse(expr, job="j").fixed_time is fixed


# --- errors ---------------------------------------------------------------------------------------

ERROR_ROWS = [
    pytest.param("0 0 L-0 * *", "day-of-month", "n from 1 to 30", id="L-0"),
    pytest.param("0 0 L-31 * *", "day-of-month", "n from 1 to 30", id="L-31"),
    pytest.param("0 0 L-x * *", "day-of-month", "n from 1 to 30", id="L-x"),
    pytest.param("0 0 L/2 * *", "day-of-month", "a step does not apply to 'L'", id="L-step"),
    pytest.param("0 0 15W/2 * *", "day-of-month", "a step does not apply", id="W-step"),
    pytest.param("0 0 0W * *", "day-of-month", "0 is out of range 1-31", id="0W"),
    pytest.param("0 0 32W * *", "day-of-month", "32 is out of range 1-31", id="32W"),
    pytest.param("0 0 W * *", "day-of-month", "also takes L, L-n, nW, LW", id="W-alone"),
    pytest.param("0 0 15L * *", "day-of-month", "'15L' is not a number", id="nL-in-dom"),
    pytest.param("0 0 1-L * *", "day-of-month", "'L' is not a number", id="L-in-a-range"),
    pytest.param("0 0 * * L", "day-of-week", "5L the last Friday", id="L-alone-in-dow"),
    pytest.param("0 0 * * L5", "day-of-week", "as nL, e.g. 5L", id="croniter-L5"),
    pytest.param("0 0 * * 5#6", "day-of-week", "k is from 1 to 5", id="5#6"),
    pytest.param("0 0 * * 5#0", "day-of-week", "k is from 1 to 5", id="5#0"),
    pytest.param("0 0 * * 5#", "day-of-week", "k is from 1 to 5", id="5#"),
    pytest.param("0 0 * * #2", "day-of-week", "value is missing", id="#2"),
    pytest.param("0 0 * * 8#1", "day-of-week", "8 is out of range 0-7", id="8#1"),
    pytest.param("0 0 * * 5#1/2", "day-of-week", "a step does not apply", id="nth-step"),
    pytest.param("0 0 * * 5W", "day-of-week", "also takes nL, n#k", id="W-in-dow"),
    pytest.param("0 # * * *", "hour", "'#' belongs in day-of-week only", id="hash-in-hour"),
    pytest.param("0 0 5#1 * *", "day-of-month", "'#' belongs in day-of-week", id="hash-in-dom"),
    pytest.param("? * * * *", "minute", "'?' belongs in day-of-month", id="question-in-minute"),
    pytest.param("0 0 * ? *", "month", "'?' belongs in day-of-month", id="question-in-month"),
    pytest.param("0 0 1,? * *", "day-of-month", "'?' stands alone", id="question-in-list"),
    pytest.param("0 0 ?/2 * *", "day-of-month", "'?' stands alone", id="question-step"),
    pytest.param("0 L * * *", "hour", "day-of-month forms", id="L-in-hour"),
    pytest.param("H * * * *", "job", "no job name was given", id="H-without-a-job"),
    pytest.param("0 0 * * H", "job", "'H' in day-of-week", id="H-without-a-job-names-field"),
    pytest.param("*/0 * * * *", "minute", "step 0 in '*/0' must be 1 or more", id="step-0"),
    pytest.param("0 0 31W 4,6,9,11 *", "day-of-month", "never fires", id="31W-30-day-months"),
    pytest.param("0 0 30W 2 *", "day-of-month", "never fires", id="30W-february"),
    pytest.param("0 0 L-29 2 *", "day-of-month", "never fires", id="L-29-february"),
    pytest.param("0 0 L-30 4 *", "day-of-month", "never fires", id="L-30-april"),
    pytest.param("0 0 LW * */6", "day-of-month", "together with day-of-week", id="LW-and-weekend"),
    pytest.param("0 0 */31 * 5#5", "day-of-month", "'5#5' (both must match", id="1st-and-5#5"),
]


@pytest.mark.parametrize(("expr", "where", "fragment"), ERROR_ROWS)
def test_errors_name_the_field(expr: str, where: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse(expr)
    [problem] = info.value.problems
    assert problem.where == where
    assert fragment in problem.message, problem.message


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("H(5)", "is not a hashed value"),
        ("HX", "is not a hashed value"),
        ("H(10-5)", "runs backwards (10 > 5)"),
        ("H(0-60)", "60 is out of range 0-59"),
        ("H(-5)", "value is missing"),
        ("H/0", "step 0"),
        ("H/x", "is not a hashed value"),
    ],
)
def test_bad_H_forms_name_the_field(item: str, fragment: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.parse(f"{item} * * * *", job="reports.daily")
    assert info.value.field == "minute"
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "expr", ["0 0 15W * 0", "0 0 L-30 * *", "0 0 * 2 1#5", "0 0 31W * *", "0 0 LW * 0,6"]
)
def test_forms_that_fire_in_some_month_are_accepted(expr: str) -> None:
    assert Schedule.parse(expr).next_after(0) > 0


def test_job_specs_parse_H_with_their_own_name_and_name_the_field_of_a_bad_form() -> None:
    assert JobSpec(name="spread.hourly", schedule="H * * * *").problems() == []
    assert JobSpec(name="month-end", schedule="0 0 L * *", tz="Europe/Berlin").problems() == []
    [problem] = JobSpec(name="never", schedule="0 0 L-30 2 *").problems()
    assert problem.where == "schedule"
    assert problem.message.startswith("day-of-month: ") and "never fires" in problem.message
    [problem] = JobSpec(name="bad", schedule="H(5) * * * *").problems()
    assert (problem.where, problem.message.split(":")[0]) == ("schedule", "minute")


# --- published vectors ----------------------------------------------------------------------------

VECTORS_DIR = Path(__file__).resolve().parent.parent / "vectors"


def test_published_H_vectors_match_the_code() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_cron_hash_vectors", VECTORS_DIR / "make_cron_hash_vectors.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    text = (VECTORS_DIR / "cron_hash_vectors.json").read_text("utf-8")
    assert text == generator.render(), "regenerate with tests/vectors/make_cron_hash_vectors.py"


def test_published_H_vectors_follow_the_documented_derivation() -> None:
    data = json.loads((VECTORS_DIR / "cron_hash_vectors.json").read_text("utf-8"))
    for row in data["hashes"]:
        assert bytes.fromhex(row["input_hex"]) == row["job"].encode() + b"\x00" + row[
            "field"
        ].encode("utf-8")
        assert int(row["hash"], 16) == documented_hash(row["job"], row["field"])
    assert {row["field"] for row in data["hashes"]} == {
        "second",
        "minute",
        "hour",
        "day-of-month",
        "month",
        "day-of-week",
    }
    # The minute rows, recomputed from the rule the file states rather than from the parser.
    for case in data["cases"]:
        if case["expression"] != "H/15 * * * *":
            continue
        offset = documented_hash(case["job"], "minute") % 15
        minutes = [datetime.fromisoformat(t).minute for t in case["next"]]
        assert sorted(minutes) == [offset, offset + 15, offset + 30, offset + 45]
