"""The protocol timings replicas run with in tests: how often they heartbeat, how long a member
lives without one, how far apart the candidates' turns are, and how long a claim is held.

A scenario on a real server lasts as long as these make it: a failover waits for a step, a dead
member for its TTL, a stolen claim for its lease. At the shipped defaults a kill-and-recover
scenario spends most of its time waiting, so tests run replicas at :data:`QUICK` unless they
say otherwise. A few run at :data:`SHIPPED` on purpose, so the defaults users get stay proven
end to end: the single-server exactly-once run and the failover-step bound in
``test_scheduler``, and the chaos and power-loss scenarios, whose fault durations are scaled
to the shipped member TTL and claim lease.

:data:`QUICK` keeps the ratios the defaults have (TTL four heartbeats, lease twice the step),
so a replica starved of CPU for a moment on a busy 2-core machine is not declared dead, and
only shrinks what a test would otherwise sit through.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hrwcron.core.config import SchedulerConfig

_SHIPPED = SchedulerConfig()


@dataclass(frozen=True)
class Timings:
    """One set of protocol timings, in seconds; the defaults are the shipped ones."""

    heartbeat_interval: float = _SHIPPED.heartbeat_interval
    member_ttl: float = _SHIPPED.member_ttl
    membership_refresh: float = _SHIPPED.membership_refresh
    failover_step: float = _SHIPPED.failover_step
    claim_lease: float = _SHIPPED.claim_lease

    def settings(self) -> dict[str, float]:
        """As ``SchedulerConfig`` keyword arguments, for in-process replicas."""
        return dataclasses.asdict(self)

    def env(self) -> dict[str, str]:
        """As ``HRWCRON_SCHEDULER_*`` variables, for replica processes."""
        return {
            f"HRWCRON_SCHEDULER_{key.upper()}": f"{value:g}s"
            for key, value in self.settings().items()
        }

    @property
    def failover_step_ms(self) -> int:
        return round(self.failover_step * 1000)

    @property
    def claim_lease_ms(self) -> int:
        return round(self.claim_lease * 1000)

    @property
    def member_ttl_ms(self) -> int:
        return round(self.member_ttl * 1000)


SHIPPED = Timings()
QUICK = Timings(
    heartbeat_interval=0.25,
    member_ttl=1.0,
    membership_refresh=0.25,
    failover_step=0.5,
    claim_lease=1.0,
)
