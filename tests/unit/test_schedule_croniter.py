"""croniter as an independent oracle where its semantics and ours coincide.

Our matcher replaces croniter at run time (croniter fires fixed-time jobs twice in a repeated
hour, reads a 6th field as seconds-last and ORs star-step day fields), but away from DST
transitions and those differences the two must agree instant for instant."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from hrwcron.core.schedule import Schedule

# Fields whose day parts never start with '*/' (croniter treats those as restricted).
MINUTES = st.sampled_from(["0", "*/5", "15,45", "10-20", "*", "7"])
HOURS = st.sampled_from(["*", "0", "9-17", "*/6", "3,15"])
DOMS = st.sampled_from(["*", "1", "13", "1-10", "15,28"])
MONTHS = st.sampled_from(["*", "1", "JAN-MAR", "6,12", "2"])
DOWS = st.sampled_from(["*", "MON-FRI", "0", "5", "SAT,SUN"])
# Zones without DST, so that croniter's DST handling is never exercised.
ZONES = st.sampled_from(["UTC", "Asia/Kolkata", "Asia/Tokyo", "America/Phoenix"])
STARTS = st.integers(min_value=1_700_000_000, max_value=1_900_000_000)


@settings(max_examples=150, deadline=None)
@given(MINUTES, HOURS, DOMS, MONTHS, DOWS, ZONES, STARTS)
def test_agrees_with_croniter_without_dst(
    minute: str, hour: str, dom: str, month: str, dow: str, zone: str, start: int
) -> None:
    expr = f"{minute} {hour} {dom} {month} {dow}"
    schedule = Schedule.parse(expr, zone)
    begin = datetime.fromtimestamp(start, tz=ZoneInfo(zone))
    oracle = croniter(expr, begin)
    at = start * 1000
    for _ in range(5):
        expected = oracle.get_next(datetime)
        at = schedule.next_after(at)
        assert at == int(expected.timestamp() * 1000), expr


# Quartz-style forms and wide steps, with croniter's spelling where it differs (its last
# weekday n is Ln, ours nL). croniter reads 31W in a 30-day month as the weekday nearest the
# 30th; hrwcron has no day 31 there (like a plain 31), so nW stays within 1-28 here.
EXTENDED = st.sampled_from(
    [
        ("0 0 L * *", "0 0 L * *"),
        ("30 9 1W * *", "30 9 1W * *"),
        ("0 9 15W * *", "0 9 15W * *"),
        ("0 9 28W * *", "0 9 28W * *"),
        ("0 9 * * 1#2", "0 9 * * 1#2"),
        ("0 9 * * 5#5", "0 9 * * 5#5"),
        ("0 9 * * 0#1", "0 9 * * 0#1"),
        ("0 9 * * 5L", "0 9 * * L5"),
        ("0 9 * * 0L", "0 9 * * L0"),
        ("0 */30 * * *", "0 */30 * * *"),
        ("*/61 * * * *", "*/61 * * * *"),
        ("0 0 1 */13 *", "0 0 1 */13 *"),
        ("0 12 ? * MON", "0 12 ? * MON"),
        ("0 12 13 * ?", "0 12 13 * ?"),
    ]
)


@settings(max_examples=100, deadline=None)
@given(EXTENDED, ZONES, STARTS)
def test_extended_forms_agree_with_croniter_without_dst(
    pair: tuple[str, str], zone: str, start: int
) -> None:
    ours, theirs = pair
    schedule = Schedule.parse(ours, zone)
    oracle = croniter(theirs, datetime.fromtimestamp(start, tz=ZoneInfo(zone)))
    at = start * 1000
    for _ in range(5):
        expected = oracle.get_next(datetime)
        at = schedule.next_after(at)
        assert at == int(expected.timestamp() * 1000), ours


def test_croniter_fires_twice_in_a_repeated_hour_and_we_do_not() -> None:
    """The reason croniter is not used at run time: 01:30 happens twice on 2026-11-01 in New
    York; croniter fires both passes, the DST policy fires the first pass only."""
    zone = ZoneInfo("America/New_York")
    after = datetime(2026, 10, 31, 12, tzinfo=UTC)
    first_pass = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    second_pass = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    oracle = croniter("30 1 * * *", after.astimezone(zone))
    theirs = [oracle.get_next(datetime).astimezone(UTC) for _ in range(3)]
    assert first_pass in theirs and second_pass in theirs
    ours = Schedule.parse("30 1 * * *", "America/New_York").due_between(
        int(after.timestamp() * 1000), int(theirs[-1].timestamp() * 1000)
    )
    assert int(first_pass.timestamp() * 1000) in ours
    assert int(second_pass.timestamp() * 1000) not in ours
