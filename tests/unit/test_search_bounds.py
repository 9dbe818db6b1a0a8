"""Every search a job can cause is bounded in steps, and what the bound cannot decide is refused.

The cost of a search is counted in steps (candidates and covered stretches examined), not timed:
the benchmark (`bench/operator.py`) measures what a step costs on this machine.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import wait_for_async
from hrwcron.core.errors import SearchExhausted
from hrwcron.core.model import JobSpec
from hrwcron.core.plan import SEARCH_BUDGET, Allowance, TickPlan

EVIL = ("* * * * * *", ["0-58 * * * * *", "59 * * * * *"])
NOW = int(datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


def test_exclusions_that_leave_one_second_in_two_minutes_are_refused_not_assumed_to_fire() -> None:
    plan = TickPlan.parse(EVIL[0], job="evil.excl", exclude=EVIL[1])
    problem = plan.static_problem()
    assert problem is not None and problem.where == "exclude"
    assert "cannot be decided" in problem.message
    late = plan.never_fires_problem(NOW)
    assert late is not None and "cannot be decided" in late.message


def test_the_spec_of_the_issue_is_refused_naming_exclude() -> None:
    spec = JobSpec(name="evil.excl", schedule=EVIL[0], exclude=EVIL[1])
    problems = spec.problems(now_ms=NOW)
    assert [p.where for p in problems] == ["exclude"]


def test_a_search_reports_the_steps_it_spent_and_stops_at_its_budget() -> None:
    plan = TickPlan.parse(EVIL[0], job="evil.excl", exclude=EVIL[1])
    found = plan.search(NOW, budget=50)
    assert (found.due, found.complete, found.steps) == (None, False, 50)


@pytest.mark.parametrize(
    ("schedule", "exclude", "most_steps"),
    [
        # Office hours excluded: the whole run of excluded hours is one step.
        ("* * * * *", ["* 9-17 * * 1-5"], 2),
        # Every weekday excluded from an every-second job: a run of five days is one step.
        ("* * * * * *", ["* * * * * 1-5"], 2),
        # An exclusion that matches every time: one step over all time, one to find nothing.
        ("0 9 * * *", ["* * * * *"], 2),
        # Whole months excluded.
        ("0 0 * * *", ["* * * 1-11 *"], 3),
    ],
)
def test_a_real_calendar_of_exclusions_costs_a_few_steps(
    schedule: str, exclude: list[str], most_steps: int
) -> None:
    plan = TickPlan.parse(schedule, job="office", exclude=exclude)
    found = plan.search(NOW)
    assert found.complete
    assert found.steps <= most_steps


def test_an_exclusion_of_every_time_is_found_to_leave_nothing() -> None:
    plan = TickPlan.parse("0 9 * * *", job="never", exclude=["* * * * *"])
    problem = plan.static_problem()
    assert problem is not None and "never fire" in problem.message


def test_an_allowance_is_shared_and_once_spent_searches_get_nothing() -> None:
    evil = TickPlan.parse(EVIL[0], job="evil.excl", exclude=EVIL[1])
    fine = TickPlan.parse("* * * * *", job="office", exclude=["* 9-17 * * 1-5"])
    allowance = Allowance(SEARCH_BUDGET + 10)
    assert evil.static_problem(allowance) is not None
    assert allowance.left == 10
    assert fine.static_problem(allowance) is None  # a few steps still fit
    evil.static_problem(allowance)
    assert allowance.left <= 0
    refused = fine.static_problem(allowance)
    assert refused is not None and "smaller requests" in refused.message


def test_iter_firing_spends_one_allowance_for_all_ticks_and_says_when_it_ran_out() -> None:
    plan = TickPlan.parse("* * * * * *", job="sec")
    found: list[int] = []
    with pytest.raises(SearchExhausted):
        for due in plan.iter_firing(NOW, allowance=Allowance(25)):
            found.append(due)
    assert len(found) == 25
    # Within the bound and up to ``until`` it simply ends.
    assert len(list(plan.iter_firing(NOW, until=NOW + 10_000))) == 10


# --- covered stretches, against a second-by-second reference ----------------------------

FIELDS = st.sampled_from(["*", "0-58", "59", "*/7", "1,2,3", "0-29", "30-59", "5"])
HOURS = st.sampled_from(["*", "9-17", "0", "*/5", "23"])
DOWS = st.sampled_from(["*", "1-5", "0,6", "3"])


@settings(max_examples=200, deadline=None)
@given(
    seconds=FIELDS,
    minutes=FIELDS,
    hours=HOURS,
    dow=DOWS,
    start=st.integers(min_value=NOW, max_value=NOW + 14 * 86_400_000),
    zone=st.sampled_from(["UTC", "America/New_York", "Australia/Lord_Howe"]),
)
def test_a_covered_stretch_is_covered_throughout_and_ends_where_coverage_ends(
    seconds: str, minutes: str, hours: str, dow: str, start: int, zone: str
) -> None:
    plan = TickPlan.parse(
        "* * * * * *", zone, job="x", exclude=[f"{seconds} {minutes} {hours} * * {dow}"]
    )
    (exclusion,) = plan.exclusions
    instant = start - start % 1000
    if not exclusion.covers(instant):
        return
    until = exclusion.covered_until(instant)
    assert until > instant
    # Every second up to the end is covered (checked on a sample of at most 5,000 seconds).
    stride = max(1000, (until - instant) // 5000 // 1000 * 1000)
    for t in range(instant, min(until, instant + 86_400_000 * 40), stride):
        assert exclusion.covers(t), (t, until)
    assert exclusion.covers(until - 1000)
    if until < instant + 400 * 86_400_000:
        assert not exclusion.covers(until)


async def test_a_backfill_over_ticks_too_sparse_to_list_is_refused_as_too_large() -> None:
    from harness.serving import serving
    from hrwcron.adapters.memory import MemoryJobs
    from hrwcron.core.ticks import format_ms

    from .test_limits import call, refusal

    # Fires at hh:59:59 only: accepted (about 120 steps to the first tick), but a day of it
    # takes more steps than one backfill may spend.
    spec = JobSpec(
        name="sparse",
        schedule="* * * * * *",
        exclude=["0-58 * * * * *", "59 0-58 * * * *"],
    )
    assert spec.problems() == []
    jobs = MemoryJobs()
    await jobs.put(spec, 0)
    async with serving(jobs) as svc:
        now = int(svc._scheduler.clock.now_ms())
        day = {
            "name": "sparse",
            "from": format_ms(now - 90_000_000),
            "to": format_ms(now - 3_600_000),
        }
        await wait_for_async(lambda: "sparse" in svc._scheduler.jobs, timeout=10, message="loaded")
        code, body = refusal(await call(svc, "backfill", day))
        assert (code, body.code, body.field) == ("413", "too_large", "from")
        assert "too sparse" in body.message
        # Two hours of it fit: two ticks, listed (as a dry run, nothing published).
        hours = {**day, "from": format_ms(now - 3 * 3_600_000), "dry_run": True}
        reply = await call(svc, "backfill", hours)
        assert reply.error is None and reply.reply is not None
