"""Server-corrected time. Schedules run on the NATS server's clock so that a replica whose own
clock is off still never fires early; the offset comes from server timestamps of its heartbeats."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .ports import ServerTime

# How far the wall clock may move against the monotonic clock between two readings before it
# counts as set (an NTP step, an operator, a restored VM) rather than slewed: NTP slews at most
# 0.5 ms per second, so 100 ms plus 1 ms per elapsed second is never reached by drift.
STEP_MS = 100.0
STEP_RATE = 0.001


@dataclass
class OffsetEstimator:
    """Keeps recent samples and trusts the one with the shortest round trip (NTP's idea):
    its error is at most half that round trip."""

    window: int = 10
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (rtt, offset)

    def add(self, sample: ServerTime) -> None:
        rtt = max(0.0, sample.received_ms - sample.sent_ms)
        offset = sample.server_ms - (sample.sent_ms + sample.received_ms) / 2
        if self.samples and abs(offset - self.offset_ms) > rtt / 2 + self.error_ms + 50:
            # The local clock jumped (or was stepped): older samples describe a clock that no
            # longer exists, however short their round trips were.
            self.samples.clear()
        self.samples.append((rtt, offset))
        while len(self.samples) > self.window:
            self.samples.popleft()

    def shift(self, delta_ms: float) -> None:
        """The local clock was set by ``-delta_ms``: every sample's offset moves to match."""
        self.samples = deque((rtt, offset + delta_ms) for rtt, offset in self.samples)

    @property
    def known(self) -> bool:
        return bool(self.samples)

    @property
    def offset_ms(self) -> float:
        if not self.samples:
            return 0.0
        return min(self.samples)[1]

    @property
    def error_ms(self) -> float:
        if not self.samples:
            return float("inf")
        return min(self.samples)[0] / 2


class Clock:
    """Wall time corrected by the estimated server offset, plus a monotonic clock for leases."""

    def __init__(
        self,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall_ms = wall_ms
        self.monotonic = monotonic
        self.estimator = OffsetEstimator()
        self.steps = 0  # how often the local clock was seen being set
        self._last: tuple[float, float] | None = None  # (wall ms, monotonic ms) last read

    def local_ms(self) -> float:
        """The local wall clock. A step of it is absorbed into the offset at once: the offset
        is only re-measured at the next heartbeat, and until then a clock set 30 s ahead
        would make ticks look due 30 s early. Server time stays continuous instead, and the
        skew check sees the step straight away."""
        wall = self._wall_ms()
        mono = self.monotonic() * 1000
        if self._last is not None:
            elapsed = mono - self._last[1]
            step = (wall - self._last[0]) - elapsed
            if abs(step) > STEP_MS + STEP_RATE * abs(elapsed):
                self.estimator.shift(-step)
                self.steps += 1
        self._last = (wall, mono)
        return wall

    def now_ms(self) -> float:
        return self.local_ms() + self.estimator.offset_ms

    @property
    def offset_ms(self) -> float:
        return self.estimator.offset_ms
