"""Which instants are ticks: one-time schedules (@at), the active window (start, end) and
exclusions, table by table, DST days and a window edge at a DST change included.

Expected instants are UTC with the local wall time they stand for in the row's id; the 2026
transitions used are listed at the top of test_schedule.py (New York 03-08 07:00Z and 11-01
06:00Z, Berlin 03-29 and 10-25 01:00Z, Lord Howe 10-03 15:30Z: 02:00 +10:30 -> 02:30 +11).
"""

from __future__ import annotations

from datetime import datetime
from itertools import islice

import pytest

from hrwcron.core.errors import ScheduleError
from hrwcron.core.model import JobSpec
from hrwcron.core.plan import TickPlan, parse_exclusion
from hrwcron.core.schedule import Schedule, instant_of_wall, wall_ms
from hrwcron.core.ticks import format_ms, to_ms


def ms(text: str) -> int:
    return to_ms(datetime.fromisoformat(text))


def iso(*texts: str) -> list[str]:
    return [format_ms(ms(t)) for t in texts]


def candidates(plan: TickPlan, after: str, limit: int = 10) -> list[str]:
    """Every tick of the plan after ``after``, excluded ones included, until the plan ends."""
    out: list[str] = []
    t: int | None = ms(after)
    while len(out) < limit:
        t = plan.next_after(t)
        if t is None:
            break
        out.append(format_ms(t))
    return out


def firing(plan: TickPlan, after: str, count: int) -> list[str]:
    return [format_ms(t) for t in islice(plan.iter_firing(ms(after)), count)]


# --- @at ------------------------------------------------------------------------------------

AT_ROWS = [
    pytest.param("@at 2026-12-24T09:00:00", "Europe/Berlin", "2026-12-24T08:00Z", id="local-cet"),
    pytest.param("@at 2026-07-01T09:00", "Europe/Berlin", "2026-07-01T07:00Z", id="local-cest"),
    pytest.param("@at 2026-12-24T09:00:00Z", "Europe/Berlin", "2026-12-24T09:00Z", id="utc"),
    pytest.param(
        "@at 2026-12-24T09:00:00+05:30", "UTC", "2026-12-24T03:30Z", id="offset-wins-over-tz"
    ),
    pytest.param(
        "@at 2026-12-24T09:00:00.250Z", "UTC", "2026-12-24T09:00:00.250Z", id="milliseconds"
    ),
    pytest.param(
        "@at 2026-03-08T02:30:00",
        "America/New_York",
        "2026-03-08T07:00Z",
        id="ny-02:30-skipped-fires-as-the-gap-ends-03:00EDT",
    ),
    pytest.param(
        "@at 2026-11-01T01:30:00",
        "America/New_York",
        "2026-11-01T05:30Z",
        id="ny-01:30-repeated-fires-on-the-first-pass-EDT",
    ),
    pytest.param(
        "@at 2026-10-04T02:15:00",
        "Australia/Lord_Howe",
        "2026-10-03T15:30Z",
        id="lord-howe-02:15-in-the-half-hour-gap-fires-at-02:30",
    ),
    pytest.param(
        "@at 2026-10-04T01:45:00",
        "Australia/Lord_Howe",
        "2026-10-03T15:15Z",
        id="lord-howe-01:45-before-the-gap",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "due"), AT_ROWS)
def test_at_is_due_once(expr: str, tz: str, due: str) -> None:
    plan = TickPlan.parse(expr, tz)
    assert plan.at_ms == ms(due)
    assert candidates(plan, "2026-01-01T00:00Z") == iso(due)
    assert plan.next_after(ms(due)) is None
    assert plan.next_after(ms(due) - 1) == ms(due)
    assert plan.final_ms == ms(due)


AT_ERRORS = [
    pytest.param("@at", "takes one date and time", id="missing"),
    pytest.param("@at 2026-12-24 09:00", "takes one date and time", id="two-words"),
    pytest.param("@at tomorrow", "is not a date and time", id="not-a-date"),
    pytest.param("@at 2026-12-24", "has no time of day", id="date-only"),
    pytest.param("@at 2026-12-24T09:00:00.000100Z", "more precise than a millisecond", id="us"),
    pytest.param("@at 9999-12-24T09:00:00Z", "outside the supported years", id="far-future"),
]


@pytest.mark.parametrize(("expr", "message"), AT_ERRORS)
def test_bad_at_is_refused_with_the_reason(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule.parse(expr, "UTC")
    assert caught.value.problems[0].where == "@at"
    assert message in caught.value.problems[0].message


def test_local_wall_time_conversions_follow_the_fixed_time_policy() -> None:
    ny = "America/New_York"
    # 01:30 happens twice on 2026-11-01: the wall time is the same, the first pass is chosen.
    assert wall_ms(ms("2026-11-01T05:30Z"), ny) == wall_ms(ms("2026-11-01T06:30Z"), ny)
    first = instant_of_wall(ms("2026-11-01T01:30Z"), ny)
    assert format_ms(first) == format_ms(ms("2026-11-01T05:30Z"))
    # Strictly after the first pass, the next instant showing 01:30 or later is the second.
    second = instant_of_wall(ms("2026-11-01T01:30Z"), ny, after=first)
    assert format_ms(second) == format_ms(first + 1)
    assert format_ms(instant_of_wall(ms("2026-03-08T02:59Z"), ny)) == format_ms(
        ms("2026-03-08T07:00Z")
    )


# --- start and end --------------------------------------------------------------------------

WINDOW_ROWS = [
    pytest.param(
        "0 * * * *",
        "UTC",
        "2026-03-01T10:00:00Z",
        "2026-03-01T12:00:00Z",
        "2026-03-01T00:00Z",
        ["2026-03-01T10:00Z", "2026-03-01T11:00Z", "2026-03-01T12:00Z"],
        id="both-ends-included",
    ),
    pytest.param(
        "0 * * * *",
        "UTC",
        "2026-03-01T10:00:00.001Z",
        "2026-03-01T11:59:59.999Z",
        "2026-03-01T00:00Z",
        ["2026-03-01T11:00Z"],
        id="a-millisecond-inside-leaves-the-edges-out",
    ),
    pytest.param(
        "0 * * * *",
        "UTC",
        "2026-03-01T10:00:00Z",
        None,
        "2026-03-01T10:30Z",
        ["2026-03-01T11:00Z", "2026-03-01T12:00Z", "2026-03-01T13:00Z"],
        id="after-start-the-schedule-as-usual",
    ),
    pytest.param(
        "0 9 * * *",
        "Europe/Berlin",
        "2026-03-01T00:00:00+01:00",
        "2026-03-31T23:59:59+02:00",
        "2026-03-28T00:00Z",
        ["2026-03-28T08:00Z", "2026-03-29T07:00Z", "2026-03-30T07:00Z", "2026-03-31T07:00Z"],
        id="berlin-march-campaign-09:00-CET-then-CEST",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        None,
        "2026-03-08T07:00:00Z",
        "2026-03-08T05:45Z",
        ["2026-03-08T06:00Z", "2026-03-08T06:30Z", "2026-03-08T07:00Z"],
        id="ny-end-at-the-spring-gap-01:00-01:30EST-03:00EDT",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T07:00:00Z",
        None,
        "2026-03-07T00:00Z",
        ["2026-03-08T07:00Z", "2026-03-09T06:30Z"],
        id="ny-start-at-the-gap-end-keeps-the-skipped-02:30-tick",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T07:00:00.001Z",
        None,
        "2026-03-07T00:00Z",
        ["2026-03-09T06:30Z", "2026-03-10T06:30Z"],
        id="ny-start-just-after-the-gap-end-drops-it",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        None,
        "2026-11-01T06:00:00Z",
        "2026-11-01T04:45Z",
        ["2026-11-01T05:00Z", "2026-11-01T05:30Z", "2026-11-01T06:00Z"],
        id="ny-end-at-fall-back-01:00-01:30EDT-01:00EST",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T06:00:00Z",
        None,
        "2026-10-31T00:00Z",
        ["2026-11-02T06:30Z"],
        id="ny-fixed-01:30-window-opens-after-the-first-pass-no-second-pass",
    ),
    pytest.param(
        "@every 90s",
        "UTC",
        "2026-03-01T00:00:00Z",
        "2026-03-01T00:05:00Z",
        "2026-02-28T00:00Z",
        [
            "2026-03-01T00:00Z",
            "2026-03-01T00:01:30Z",
            "2026-03-01T00:03Z",
            "2026-03-01T00:04:30Z",
        ],
        id="every-90s-inside-five-minutes",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "start", "end", "after", "ticks"), WINDOW_ROWS)
def test_window(
    expr: str, tz: str, start: str | None, end: str | None, after: str, ticks: list[str]
) -> None:
    plan = TickPlan.parse(expr, tz, start=start, end=end)
    assert candidates(plan, after, limit=len(ticks)) == iso(*ticks)
    if end is not None:
        assert plan.next_after(ms(ticks[-1])) is None
        assert plan.final_ms == ms(end)


# --- exclusions -----------------------------------------------------------------------------

EXCLUDE_ROWS = [
    pytest.param(
        "0 9 * * *",
        "Europe/Berlin",
        ["* * 25 12 *"],
        "2026-12-23T12:00Z",
        ["2026-12-24T08:00Z", "2026-12-26T08:00Z"],
        ["2026-12-25T08:00Z"],
        id="cron-day-christmas",
    ),
    pytest.param(
        "0 9 * * *",
        "Europe/Berlin",
        ["2026-12-24..2026-12-26"],
        "2026-12-23T12:00Z",
        ["2026-12-27T08:00Z", "2026-12-28T08:00Z"],
        ["2026-12-24T08:00Z", "2026-12-25T08:00Z", "2026-12-26T08:00Z"],
        id="range-of-days-both-included",
    ),
    pytest.param(
        "0 23 * * *",
        "Europe/Berlin",
        ["2026-12-25"],
        "2026-12-24T12:00Z",
        ["2026-12-24T22:00Z", "2026-12-26T22:00Z"],
        ["2026-12-25T22:00Z"],
        id="one-local-day-23:00-CET-is-still-that-day",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Berlin",
        ["2026-12-24T18:00..2026-12-24T21:00"],
        "2026-12-24T15:30Z",
        ["2026-12-24T16:00Z", "2026-12-24T20:00Z"],
        ["2026-12-24T17:00Z", "2026-12-24T18:00Z", "2026-12-24T19:00Z"],
        id="local-times-from-included-to-excluded",
    ),
    pytest.param(
        "*/15 * * * * *",
        "UTC",
        ["0-29 * * * * *"],
        "2026-01-01T00:00:00Z",
        ["2026-01-01T00:00:30Z", "2026-01-01T00:00:45Z", "2026-01-01T00:01:30Z"],
        ["2026-01-01T00:01:00Z", "2026-01-01T00:01:15Z"],
        id="six-fields-exclude-by-the-second",
    ),
    pytest.param(
        "*/20 * * * * *",
        "UTC",
        ["1 * * * *"],
        "2026-01-01T00:00:40Z",
        ["2026-01-01T00:02:00Z"],
        ["2026-01-01T00:01:00Z", "2026-01-01T00:01:20Z", "2026-01-01T00:01:40Z"],
        id="five-fields-exclude-the-whole-minute",
    ),
    pytest.param(
        "@every 1h",
        "UTC",
        ["* * * * 6,0"],
        "2026-01-02T22:30Z",
        ["2026-01-02T23:00Z", "2026-01-05T00:00Z"],
        ["2026-01-03T00:00Z", "2026-01-04T23:00Z"],
        id="weekends-friday-to-monday",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        ["2026-03-08"],
        "2026-03-08T04:00Z",
        ["2026-03-08T04:30Z", "2026-03-09T04:00Z"],
        ["2026-03-08T05:00Z", "2026-03-08T07:00Z", "2026-03-09T03:30Z"],
        id="ny-spring-day-23-hours-excluded-whole",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        ["2026-11-01"],
        "2026-11-01T03:30Z",
        ["2026-11-02T05:00Z"],
        ["2026-11-01T04:00Z", "2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-02T04:00Z"],
        id="ny-fall-day-25-hours-excluded-whole",
    ),
    pytest.param(
        "*/30 * * * *",
        "America/New_York",
        ["* 1 * * *"],
        "2026-11-01T04:45Z",
        ["2026-11-01T07:00Z"],
        ["2026-11-01T05:00Z", "2026-11-01T05:30Z", "2026-11-01T06:00Z", "2026-11-01T06:30Z"],
        id="ny-hour-01-excluded-on-both-passes",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Berlin",
        ["2026-03-29T01:30..2026-03-29T02:30"],
        "2026-03-29T00:00Z",
        ["2026-03-29T01:00Z", "2026-03-29T02:00Z"],
        ["2026-03-29T00:30Z"],
        id="berlin-range-ending-in-the-gap-ends-at-03:00-CEST",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "exclude", "after", "fire", "excluded"), EXCLUDE_ROWS)
def test_exclusions(
    expr: str, tz: str, exclude: list[str], after: str, fire: list[str], excluded: list[str]
) -> None:
    plan = TickPlan.parse(expr, tz, exclude=exclude)
    assert firing(plan, after, len(fire)) == iso(*fire)
    for due in fire:
        assert not plan.excluded(ms(due)), due
    for due in excluded:
        # Only real ticks of the schedule are asked about in the engine, but covering is a
        # property of the instant, so any instant can be checked.
        assert plan.excluded(ms(due)), due
    # The engine still sees excluded ticks (to count them at their instant): the candidate
    # sequence is the schedule's, the exclusions take nothing out of it.
    assert candidates(plan, after, 3) == candidates(TickPlan.parse(expr, tz), after, 3)


def test_a_day_exclusion_is_stepped_over_not_walked() -> None:
    """Every second of a weekend is a candidate; the search for the next firing tick steps
    over each excluded day at once instead of looking at 172,800 of them."""
    plan = TickPlan.parse("* * * * * *", "UTC", exclude=["* * * * 6,0"])
    found = plan.search(ms("2026-01-02T23:59:59Z"), budget=10)
    assert found.due == ms("2026-01-05T00:00Z")


# --- validation -----------------------------------------------------------------------------


def problems(**fields: object) -> list[tuple[str, str]]:
    spec = JobSpec(**{"name": "j", "schedule": "0 * * * *", **fields})  # type: ignore[arg-type]
    return [(p.where, p.message) for p in spec.problems()]


PROBLEM_ROWS = [
    pytest.param(
        {"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"},
        "end",
        "is before start",
        id="end-before-start",
    ),
    pytest.param({"start": "2026-03-01T00:00:00"}, "start", "no UTC offset", id="start-local"),
    pytest.param({"end": "soon"}, "end", "not an RFC 3339 instant", id="end-garbage"),
    pytest.param({"start": "2026-03-01"}, "start", "no time of day", id="start-date-only"),
    pytest.param(
        {"start": "2026-03-01T10:10:00Z", "end": "2026-03-01T10:20:00Z"},
        "end",
        "no instant of the schedule falls between start and end",
        id="window-without-a-tick",
    ),
    pytest.param({"exclude": ["61 * * * *"]}, "exclude[0]", "minute", id="exclude-bad-cron"),
    pytest.param({"exclude": ["@every 1h"]}, "exclude[0]", "@every", id="exclude-every"),
    pytest.param(
        {"exclude": ["2026-12-25", "2026-12-26..2026-12-24"]},
        "exclude[1]",
        "runs backwards",
        id="exclude-backwards",
    ),
    pytest.param(
        {"exclude": ["2026-12-24T18:00"]}, "exclude[0]", "single time", id="exclude-instant"
    ),
    pytest.param(
        {"exclude": ["2026-12-24T18:00Z..2026-12-24T20:00Z"]},
        "exclude[0]",
        "drop the offset",
        id="exclude-offset",
    ),
    pytest.param(
        {"exclude": ["2026-12-24..2026-12-24T20:00"]},
        "exclude[0]",
        "both ends as dates or both as date and time",
        id="exclude-mixed",
    ),
    pytest.param({"exclude": ["Christmas"]}, "exclude[0]", "not understood", id="exclude-word"),
    pytest.param({"exclude": [""]}, "exclude[0]", "is empty", id="exclude-empty"),
    pytest.param(
        {"exclude": ["* * * * *"]},
        "exclude",
        "removes every tick",
        id="exclude-everything",
    ),
    pytest.param(
        {
            "start": "2026-03-01T00:00:00Z",
            "end": "2026-03-31T23:59:59Z",
            "exclude": ["2026-03-01..2026-03-31"],
        },
        "exclude",
        "removes every tick up to end",
        id="exclude-the-whole-window",
    ),
    pytest.param(
        {"schedule": "@at 2026-12-25T09:00:00", "exclude": ["* * 25 12 *"]},
        "exclude",
        "removes every tick",
        id="exclude-the-one-time-instant",
    ),
    pytest.param(
        {"schedule": "@at 2026-12-25T09:00:00Z", "start": "2026-12-26T00:00:00Z"},
        "start",
        "is after the @at instant",
        id="at-before-start",
    ),
    pytest.param({"schedule": "@at 2026-13-25T09:00:00"}, "schedule", "@at", id="at-garbage"),
    pytest.param({"max_runs": 0}, "max_runs", "from 1 to", id="max-runs-zero"),
    pytest.param({"delete_after": 3600.0}, "delete_after", "run out of ticks", id="delete-after"),
    pytest.param(
        {"delete_after": -1.0, "max_runs": 3}, "delete_after", "more than 0", id="delete-neg"
    ),
]


@pytest.mark.parametrize(("fields", "where", "message"), PROBLEM_ROWS)
def test_bad_fields_are_refused_naming_the_field(
    fields: dict[str, object], where: str, message: str
) -> None:
    found = problems(**fields)
    assert [w for w, _ in found] == [where], found
    assert message in found[0][1], found


@pytest.mark.parametrize(
    "fields",
    [
        {"schedule": "@at 2026-12-24T09:00:00", "delete_after": 86400.0},
        {"end": "2026-03-31T00:00:00Z", "delete_after": 60.0},
        {"max_runs": 3, "delete_after": 60.0},
        {"start": "2026-03-01T00:00:00Z", "end": "2026-03-01T00:00:00Z"},
        {"exclude": ["* * 25 12 *", "2026-01-01", "2026-12-24T18:00..2026-12-27T06:00"]},
    ],
    ids=["at-delete-after", "end-delete-after", "max-runs", "one-instant-window", "exclusions"],
)
def test_good_fields_pass(fields: dict[str, object]) -> None:
    assert problems(**fields) == []


NOW = ms("2026-03-20T12:00Z")


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        pytest.param(
            {"schedule": "@at 2026-03-20T11:00:00Z"},
            "schedule",
            "is not in the future",
            id="at-in-the-past",
        ),
        pytest.param({"end": "2026-03-19T00:00:00Z"}, "end", "has passed", id="end-passed"),
        pytest.param(
            {
                "start": "2026-03-01T00:00:00Z",
                "end": "2026-03-31T23:00:00Z",
                "exclude": ["2026-03-15..2026-03-31"],
            },
            "exclude",
            "removes every remaining tick up to end",
            id="exclusions-cover-the-rest-of-the-window",
        ),
        pytest.param(
            {"exclude": ["2026-01-01..2199-12-31"]},
            "exclude",
            "removes every remaining tick",
            id="exclusions-cover-a-century",
        ),
    ],
)
def test_writes_made_now_are_refused_when_nothing_would_fire(
    fields: dict[str, object], where: str, message: str
) -> None:
    spec = JobSpec(**{"name": "j", "schedule": "0 * * * *", **fields})  # type: ignore[arg-type]
    # Held to the rules of any time, the spec is fine: a config file keeps loading.
    assert spec.problems() == []
    found = [(p.where, p.message) for p in spec.problems(now_ms=NOW)]
    assert [w for w, _ in found] == [where], found
    assert message in found[0][1], found


def test_a_job_that_still_fires_passes_the_checks_of_now() -> None:
    spec = JobSpec(
        name="j",
        schedule="0 * * * *",
        start="2026-03-01T00:00:00Z",
        end="2026-03-31T23:00:00Z",
        exclude=["2026-03-15..2026-03-30"],
    )
    assert spec.problems(now_ms=NOW) == []
    assert format_ms(spec.plan().search(NOW).due or 0) == format_ms(ms("2026-03-31T00:00Z"))


def test_exclusion_parser_names_its_entry() -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_exclusion("* * 32 * *", "UTC", where="exclude[3]")
    assert caught.value.problems[0].where == "exclude[3]"
    assert "day-of-month" in caught.value.problems[0].message
