"""Server time from heartbeat samples never runs ahead of the server's clock, wherever in the
round trip the server stamped the heartbeat: a leader that queues a write before stamping it
(just elected, catching up, busy) stamps it late, and a midpoint estimate would then fire
ticks early by up to half the round trip."""

from __future__ import annotations

import pytest

from harness.engine_parts import Clocks
from hrwcron.engine.clock import Clock
from hrwcron.engine.ports import ServerTime

SERVER_AHEAD_MS = 250.0


def sample(clocks: Clocks, clock: Clock, rtt_ms: float, stamped_at: float) -> ServerTime:
    """A heartbeat whose round trip takes ``rtt_ms``, stamped ``stamped_at`` of the way in."""
    sent = clock.local_ms()
    clocks.advance(rtt_ms * stamped_at)
    server = clocks.real_ms + SERVER_AHEAD_MS
    clocks.advance(rtt_ms * (1 - stamped_at))
    return ServerTime(sent, server, clock.local_ms())


def server_now(clocks: Clocks) -> float:
    return clocks.real_ms + SERVER_AHEAD_MS


@pytest.mark.parametrize(
    ("rtt_ms", "stamped_at"),
    [
        (2, 0.5),
        (1000, 0.0),  # stamped on arrival, the answer slow (replication over a slow route)
        (1000, 0.5),
        (1000, 0.9),  # queued at the leader before the stamp
        (1000, 1.0),
        (5000, 1.0),
    ],
)
def test_one_sample_never_puts_server_time_ahead_and_lags_by_at_most_its_round_trip(
    rtt_ms: float, stamped_at: float
) -> None:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    clock.estimator.add(sample(clocks, clock, rtt_ms, stamped_at))
    for _ in range(5):
        clocks.advance(333)
        lag = server_now(clocks) - clock.now_ms()
        assert 0 <= lag <= rtt_ms * (1 - stamped_at) + 1e-6
        assert clock.latest_ms() >= server_now(clocks)  # what lateness is judged by


def test_the_tightest_bound_of_the_window_wins_and_a_slow_sample_does_not_undo_it() -> None:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    clock.estimator.add(sample(clocks, clock, 1200, 0.95))
    assert server_now(clocks) - clock.now_ms() >= 0
    clock.estimator.add(sample(clocks, clock, 2, 0.5))
    assert 0 <= server_now(clocks) - clock.now_ms() <= 1
    clock.estimator.add(sample(clocks, clock, 1500, 0.0))  # slow, stamped on arrival
    assert 0 <= server_now(clocks) - clock.now_ms() <= 1
    assert len(clock.estimator.samples) == 3, "a slow sample is no contradiction"


def test_the_reported_skew_is_the_middle_of_the_bounds() -> None:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    clock.estimator.add(sample(clocks, clock, 800, 0.5))
    assert clock.offset_ms == pytest.approx(SERVER_AHEAD_MS)
    assert clock.estimator.upper_ms - clock.estimator.lower_ms == pytest.approx(800)
    assert clock.now_ms() == pytest.approx(server_now(clocks) - 400)


def test_a_sample_outside_the_bounds_is_a_set_clock_and_replaces_them() -> None:
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    for _ in range(3):
        clock.estimator.add(sample(clocks, clock, 2, 0.5))
    sent = clock.local_ms()
    clocks.advance(2)
    # The server's clock set 2 s forward, as an operator would.
    moved = ServerTime(sent, clocks.real_ms + SERVER_AHEAD_MS + 2_000, clock.local_ms())
    clock.estimator.add(moved)
    assert len(clock.estimator.samples) == 1
    assert 0 <= server_now(clocks) + 2_000 - clock.now_ms() <= 2


@pytest.mark.parametrize("back_ms", [45.0, 400.0, 30_000.0])
def test_a_server_clock_set_back_replaces_every_sample_it_contradicts(back_ms: float) -> None:
    """Tight samples, then the server's clock goes back by a little or a lot: the lower bound
    from before would run ahead of it, so the samples the new one contradicts go at once."""
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    for _ in range(5):
        clock.estimator.add(sample(clocks, clock, 2, 0.5))
        clocks.advance(1000)
    sent = clock.local_ms()
    clocks.advance(1)
    stamp = server_now(clocks) - back_ms
    clocks.advance(1)
    clock.estimator.add(ServerTime(sent, stamp, clock.local_ms()))
    assert len(clock.estimator.samples) == 1
    behind = server_now(clocks) - back_ms - clock.now_ms()
    assert 0 <= behind <= 2


def test_an_answer_received_before_it_was_sent_still_bounds_from_below() -> None:
    """Readings of a clock that was set during the round trip can come out reversed."""
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    received = clock.local_ms()
    clock.estimator.add(ServerTime(received + 5, server_now(clocks), received))
    assert clock.now_ms() <= server_now(clocks)
