"""Where a replica starts a job's ticks: pure functions of the plan, now, the lateness window,
the newest trigger in the stream and when the spec was written."""

from __future__ import annotations

import pytest

from hrwcron.core.plan import TickPlan
from hrwcron.core.turns import due_after, first_due

MIN = 60_000
T0 = 1_800_000_000_000 - 1_800_000_000_000 % (60 * MIN)  # the top of an hour (UTC)
EVERY_MINUTE = TickPlan.parse("* * * * *")
# Every minute but the even ones.
ODD_MINUTES = TickPlan.parse("* * * * *", exclude=["*/2 * * * *"])


@pytest.mark.parametrize(
    ("now", "lateness", "last", "written", "expected", "why"),
    [
        (T0 + 30_000, 60_000, None, 0, T0, "a tick inside the lateness window still counts"),
        (T0 + 30_000, 10_000, None, 0, T0 + MIN, "one past the window does not"),
        (T0 + 30_000, 60_000, T0, 0, T0 + MIN, "one the stream holds is done"),
        (T0 + 30_000, 60_000, T0 - 5 * MIN, 0, T0, "an old trigger moves nothing"),
        (T0 + 30_000, 60_000, None, T0 + 1, T0 + MIN, "nothing from before the spec was written"),
        (T0 + 3 * MIN, 10 * MIN, T0 + 5 * MIN, 0, T0 + 6 * MIN, "a watermark ahead of now"),
    ],
)
def test_first_due(
    now: int, lateness: int, last: int | None, written: int, expected: int, why: str
) -> None:
    got = first_due(
        EVERY_MINUTE, now_ms=now, lateness_ms=lateness, last_done_ms=last, written_ms=written
    )
    assert got == expected, why


@pytest.mark.parametrize(
    ("plan", "done", "now", "expected", "why"),
    [
        (EVERY_MINUTE, T0, T0 + 30_000, T0 + MIN, "the next tick after the one done"),
        (ODD_MINUTES, T0 + MIN, T0 + 10 * MIN, T0 + 3 * MIN, "an excluded one past is passed"),
        (ODD_MINUTES, T0 + MIN, T0 + MIN + 1, T0 + 2 * MIN, "one ahead is kept, counted when due"),
    ],
)
def test_due_after(plan: TickPlan, done: int, now: int, expected: int, why: str) -> None:
    assert due_after(plan, done, now) == expected, why


def test_a_plan_that_ends_has_no_tick_after_its_last() -> None:
    once = TickPlan.parse("@at 2027-01-15T08:00:00Z")
    only = once.next_after(0)
    assert only is not None
    assert due_after(once, only, only + 1) is None
