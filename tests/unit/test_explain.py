"""The explanation of a plan's next ticks that ``hrwcron next --explain`` and the console show."""

from __future__ import annotations

from datetime import timedelta

from hrwcron.core.explain import Instant, explain_next, utc_offset, why_fewer
from hrwcron.core.plan import TickPlan, parse_rfc3339
from hrwcron.core.ticks import format_ms


def parse_ms(text: str) -> int:
    return parse_rfc3339(text, "test")


AFTER = parse_ms("2026-12-23T12:00:00Z")


def test_excluded_instants_name_their_rule_and_the_stretch_they_cover() -> None:
    plan = TickPlan.parse("0 * * * *", exclude=["* 0-6 * * *"])
    found = explain_next(plan, parse_ms("2026-12-23T22:30:00Z"), 3)
    assert found.found == 3 and not found.exhausted
    assert [format_ms(i.due) for i in found.instants if i.fires] == [
        "2026-12-23T23:00:00.000Z",
        "2026-12-24T07:00:00.000Z",
        "2026-12-24T08:00:00.000Z",
    ]
    (skipped,) = [i for i in found.instants if not i.fires]
    assert skipped == Instant(
        parse_ms("2026-12-24T00:00:00Z"), "* 0-6 * * *", parse_ms("2026-12-24T07:00:00Z")
    )


def test_fewer_instants_say_why() -> None:
    once = TickPlan.parse("@at 2026-12-24T09:00:00Z")
    found = explain_next(once, AFTER, 3)
    assert found.found == 1
    assert why_fewer(once, found, None) == (
        "1 instant: a one-time schedule is due once, at 2026-12-24T09:00:00.000Z"
    )
    daily = TickPlan.parse("0 9 * * *")
    limited = explain_next(daily, AFTER, 5, runs_left=2)
    assert limited.found == 2
    assert why_fewer(daily, limited, 2) == "2 instants: the job has 2 runs left"
    ended = TickPlan.parse("0 9 * * *", end="2026-12-24T10:00:00Z")
    assert why_fewer(ended, explain_next(ended, AFTER, 4), None).startswith(
        "1 instant: no tick after the end, 2026-12-24T10:00:00"
    )


def test_exclusions_too_dense_to_decide_exhaust_the_walk() -> None:
    plan = TickPlan.parse("* * * * * *", exclude=["*/2 * * * * *", "1-59/2 * * * * *"])
    assert explain_next(plan, AFTER, 1).exhausted


def test_the_offset_shows_a_daylight_saving_change_between_two_ticks() -> None:
    before = utc_offset(parse_ms("2026-03-29T00:30:00Z"), "Europe/Berlin")
    after = utc_offset(parse_ms("2026-03-29T01:30:00Z"), "Europe/Berlin")
    assert (before, after) == (timedelta(hours=1), timedelta(hours=2))
    assert utc_offset(AFTER, "UTC") == timedelta(0)
