"""Server-corrected time. Schedules run on the NATS server's clock so that a replica whose own
clock is off still never fires early; the offset comes from server timestamps of its heartbeats."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hrwcron.engine.ports import ServerTime

# How far the wall clock may move against the monotonic clock between two readings before it
# counts as set (an NTP step, an operator, a restored VM) rather than slewed: NTP slews at most
# 0.5 ms per second, so 100 ms plus 1 ms per elapsed second is never reached by drift.
STEP_MS = 100.0
STEP_RATE = 0.001


@dataclass
class OffsetEstimator:
    """Bounds the server's clock from recent samples and keeps the lower bound.

    A heartbeat's server stamp was taken somewhere between sending and receiving, so the offset
    lies in ``[stamp - received, stamp - sent]``. Where in that round trip is unknown: a leader
    that queues the write before stamping it (just elected, catching up, busy) stamps it late.
    The midpoint (NTP's estimate) would then run this replica's clock ahead of the server's by
    up to half the round trip, and a tick fire early by that much; the lower bound never runs
    ahead, and costs at most one round trip of lateness. The tightest bound of the window wins.
    """

    window: int = 10
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (low, high) offset
    # The bounds trusted now, kept because the clock is read several times per tick.
    _low: float | None = None
    _high: float = float("inf")

    def add(self, sample: ServerTime) -> None:
        low = sample.server_ms - max(sample.received_ms, sample.sent_ms)
        high = sample.server_ms - sample.sent_ms
        # Older samples the new one contradicts describe a clock that has since moved (the local
        # one set, the server's set, another server leading): they go, however tight they were.
        # Kept, a lower bound from before a server's clock went back would run ahead of it.
        kept = [(lo, hi) for lo, hi in self.samples if lo <= high and hi >= low]
        if len(kept) < len(self.samples):
            self.samples = deque(kept)
        self.samples.append((low, high))
        while len(self.samples) > self.window:
            self.samples.popleft()
        self._low = max(lo for lo, _ in self.samples)
        self._high = min(hi for _, hi in self.samples)

    @property
    def known(self) -> bool:
        return bool(self.samples)

    @property
    def lower_ms(self) -> float:
        """Server time minus local time, at least: the clock that ticks are fired by."""
        return 0.0 if self._low is None else self._low

    @property
    def upper_ms(self) -> float:
        """Server time minus local time, at most: the clock a tick's lateness is judged by, so
        that none is published after its window closed on the server's clock."""
        return 0.0 if self._low is None else max(self._low, self._high)

    @property
    def offset_ms(self) -> float:
        """The best guess of server time minus local time (the middle of the bounds): the skew
        reported and judged against ``max_clock_skew``."""
        return (self.lower_ms + self.upper_ms) / 2


class Clock:
    """Wall time corrected by the estimated server offset, plus a monotonic clock for leases.

    Offsets are measured against the local clock with every step of it taken out (see
    :meth:`local_ms`), so a clock set while the replica runs moves neither server time nor
    the samples behind it; :attr:`offset_ms` puts the steps back in to report the skew."""

    def __init__(
        self,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000,
        monotonic: Callable[[], float] = lambda: time.monotonic(),
    ) -> None:
        # Both read the time module when called, not when this module was imported, so a test
        # that runs the engine on virtual time (tests/harness/virtual_time.py) moves them too.
        self._wall_ms = wall_ms
        self.monotonic = monotonic
        self.estimator = OffsetEstimator()
        self.steps = 0  # how often the local wall clock was seen being set
        self.stepped_ms = 0.0  # by how much, in all
        self._last: tuple[float, float] | None = None  # (wall ms, monotonic ms) last read

    def local_ms(self) -> float:
        """The local wall clock minus every step it took while this process ran.

        A step (an NTP step, an operator, a restored VM) is told from drift by comparing the
        wall clock with the monotonic one between readings. Taking steps out keeps this clock
        continuous: the offset is only re-measured at heartbeats, and a step between two of
        them must not make ticks look due 30 s early, nor turn a heartbeat sample taken just
        before the step into one that seems to say the offset changed."""
        wall = self._wall_ms()
        mono = self.monotonic() * 1000
        if self._last is not None:
            elapsed = mono - self._last[1]
            step = (wall - self._last[0]) - elapsed
            if abs(step) > STEP_MS + STEP_RATE * abs(elapsed):
                self.stepped_ms += step
                self.steps += 1
        self._last = (wall, mono)
        return wall - self.stepped_ms

    def now_ms(self) -> float:
        """Server time, never ahead of the server's clock (see :class:`OffsetEstimator`)."""
        return self.local_ms() + self.estimator.lower_ms

    def latest_ms(self) -> float:
        """The latest server time can be (see :class:`OffsetEstimator`)."""
        return self.local_ms() + self.estimator.upper_ms

    def earliest_ms(self, max_skew_ms: float) -> float:
        """Server time, or the local clock when that is earlier and the two disagree by more
        than ``max_skew_ms``: for bounds that pass ticks over as too old (the lateness window a
        job starts tracking from, catch-up "latest"). Either clock may then be the one set
        wrong, and a server clock stepped ahead must not make owed ticks look past their window.
        """
        now = self.now_ms()
        return min(now, self.local_ms()) if self.disagrees(max_skew_ms) else now

    def disagrees(self, max_skew_ms: float) -> bool:
        """Whether server time and the local clock are more than ``max_skew_ms`` apart."""
        return abs(self.offset_ms) > max_skew_ms

    @property
    def offset_ms(self) -> float:
        """Server time minus the local wall clock as it is set now: the skew."""
        self.local_ms()  # a step since the last reading counts at once
        return self.estimator.offset_ms - self.stepped_ms
