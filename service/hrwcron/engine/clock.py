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
    """Keeps recent samples and trusts the one with the shortest round trip (NTP's idea):
    its error is at most half that round trip."""

    window: int = 10
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (rtt, offset)
    # The sample trusted now, kept because the clock is read several times per tick.
    _best: tuple[float, float] | None = None

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
        self._best = min(self.samples)

    @property
    def known(self) -> bool:
        return bool(self.samples)

    @property
    def offset_ms(self) -> float:
        best = self._best
        return 0.0 if best is None else best[1]

    @property
    def error_ms(self) -> float:
        best = self._best
        return float("inf") if best is None else best[0] / 2


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
        return self.local_ms() + self.estimator.offset_ms

    @property
    def offset_ms(self) -> float:
        """Server time minus the local wall clock as it is set now: the skew."""
        self.local_ms()  # a step since the last reading counts at once
        return self.estimator.offset_ms - self.stepped_ms
