"""Server-corrected time. Schedules run on the NATS server's clock so that a replica whose own
clock is off still never fires early; the offset comes from server timestamps of its heartbeats."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .ports import ServerTime


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

    def local_ms(self) -> float:
        return self._wall_ms()

    def now_ms(self) -> float:
        return self._wall_ms() + self.estimator.offset_ms

    @property
    def offset_ms(self) -> float:
        return self.estimator.offset_ms
