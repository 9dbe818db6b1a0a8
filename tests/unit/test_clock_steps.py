"""A local clock that is set (stepped) while a replica runs: server time stays continuous and
the step shows as skew at once, instead of ticks looking due early until the next heartbeat."""

from __future__ import annotations

import pytest

from harness.engine_parts import Clocks
from hrwcron.engine.clock import Clock
from hrwcron.engine.ports import ServerTime


def synced(server_ahead_ms: float = 0.0) -> tuple[Clocks, Clock]:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    for _ in range(3):
        sent = clock.local_ms()
        clocks.advance(2)
        received = clock.local_ms()
        server = clocks.real_ms - 1 + server_ahead_ms
        clock.estimator.add(ServerTime(sent, server, received))
        clocks.advance(1000)
    return clocks, clock


@pytest.mark.parametrize("step_ms", [30_000.0, -30_000.0, 2_000.0, -2_000.0, 150.0])
def test_a_step_of_the_local_clock_keeps_server_time_continuous_and_shows_as_skew(
    step_ms: float,
) -> None:
    clocks, clock = synced(server_ahead_ms=40)
    before = clock.now_ms()
    assert abs(before - (clocks.real_ms + 40)) < 5
    clocks.wall_offset_ms += step_ms
    clocks.advance(300)
    after = clock.now_ms()
    assert abs(after - (clocks.real_ms + 40)) < 5, "server time jumped with the local clock"
    assert abs(clock.offset_ms - (40 - step_ms)) < 5
    assert clock.steps == 1


def test_a_fresh_heartbeat_after_a_step_agrees_with_the_absorbed_offset() -> None:
    clocks, clock = synced()
    clocks.wall_offset_ms += 30_000
    assert abs(clock.now_ms() - clocks.real_ms) < 5
    sent = clock.local_ms()
    clocks.advance(2)
    received = clock.local_ms()
    clock.estimator.add(ServerTime(sent, clocks.real_ms - 1, received))
    assert len(clock.estimator.samples) == 4, "the new sample contradicted the shifted ones"
    assert abs(clock.offset_ms + 30_000) < 5


def test_slewing_is_not_a_step() -> None:
    clocks, clock = synced()
    for _ in range(100):
        clocks.wall_offset_ms += 0.5  # NTP's fastest slew, 500 ppm of each second
        clocks.advance(1000)
        clock.now_ms()
    assert clock.steps == 0
    assert abs(clock.offset_ms) < 5


def test_a_long_quiet_gap_tolerates_proportionally_more_slew() -> None:
    clocks, clock = synced()
    clocks.advance(3_600_000)
    clocks.wall_offset_ms += 1_800  # an hour at 500 ppm
    clock.now_ms()
    assert clock.steps == 0


def test_a_step_before_any_sample_is_still_seen_as_skew() -> None:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    clock.now_ms()
    clocks.wall_offset_ms += 30_000
    assert clock.now_ms() == clocks.real_ms
    assert clock.offset_ms == -30_000 and clock.steps == 1


def _sample(clocks: Clocks, clock: Clock, *, step_between_ms: float = 0.0) -> ServerTime:
    sent = clock.local_ms()
    clocks.advance(1)
    clocks.wall_offset_ms += step_between_ms
    server = clocks.real_ms
    clocks.advance(1)
    return ServerTime(sent, server, clock.local_ms())


@pytest.mark.parametrize("step_ms", [30_000.0, -30_000.0])
def test_a_heartbeat_sample_taken_before_a_step_but_added_after_it_changes_nothing(
    step_ms: float,
) -> None:
    """The heartbeat reads the clock, awaits the server, and adds its sample later; meanwhile
    the timer may read the clock after a step. The sample must still agree with the rest."""
    clocks, clock = synced()
    sample = _sample(clocks, clock)
    clocks.wall_offset_ms += step_ms
    assert abs(clock.now_ms() - clocks.real_ms) < 5  # the timer sees the step first
    clock.estimator.add(sample)
    assert len(clock.estimator.samples) == 4
    assert abs(clock.now_ms() - clocks.real_ms) < 5
    assert abs(clock.offset_ms + step_ms) < 5


@pytest.mark.parametrize("step_ms", [30_000.0, -30_000.0])
def test_a_step_during_a_heartbeat_round_trip_leaves_a_sound_sample(step_ms: float) -> None:
    clocks, clock = synced()
    sample = _sample(clocks, clock, step_between_ms=step_ms)
    assert 0 <= sample.received_ms - sample.sent_ms < 5
    clock.estimator.add(sample)
    assert abs(clock.now_ms() - clocks.real_ms) < 5
    assert abs(clock.offset_ms + step_ms) < 5


def test_setting_a_skewed_clock_right_makes_the_skew_go_at_once() -> None:
    clocks = Clocks()
    clocks.wall_offset_ms = -5_000  # started 5 s behind: not ready
    clock = Clock(clocks.wall, clocks.monotonic)
    clock.estimator.add(_sample(clocks, clock))
    assert abs(clock.offset_ms - 5_000) < 5
    clocks.wall_offset_ms = 0  # NTP steps it right
    assert abs(clock.offset_ms) < 5
    assert abs(clock.now_ms() - clocks.real_ms) < 5


def test_a_suspended_host_is_behind_until_the_next_heartbeat_then_right() -> None:
    """Suspend stops the monotonic clock but not the wall clock, which looks like a step
    forward: server time lags (never early) and the skew says not ready until the next sample
    re-measures the offset."""
    clocks, clock = synced()
    clocks.real_ms += 60_000
    clocks.suspended_ms += 60_000
    assert clock.now_ms() < clocks.real_ms
    assert abs(clock.offset_ms) > 1_000
    clock.estimator.add(_sample(clocks, clock))
    assert abs(clock.now_ms() - clocks.real_ms) < 5
    assert abs(clock.offset_ms) < 5
