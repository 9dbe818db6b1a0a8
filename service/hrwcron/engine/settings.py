"""A replica's engine settings: identity, timings and limits, as the composition root sets them."""

from __future__ import annotations

from dataclasses import dataclass

from hrwcron.core.config import SchedulerConfig

# The configuration's defaults (core/config/schema.py) are the engine's: defined there once.
_CONFIGURED = SchedulerConfig()


@dataclass(frozen=True)
class Settings:
    node_id: str
    weight: float = _CONFIGURED.weight
    tags: tuple[str, ...] = ()
    heartbeat_interval: float = _CONFIGURED.heartbeat_interval
    member_ttl: float = _CONFIGURED.member_ttl
    membership_refresh: float = _CONFIGURED.membership_refresh
    failover_step: float = _CONFIGURED.failover_step
    claim_lease: float = _CONFIGURED.claim_lease
    max_clock_skew: float = _CONFIGURED.max_clock_skew
    subject_prefix: str = _CONFIGURED.subject_prefix
    max_payload: int = _CONFIGURED.max_payload
    max_in_flight: int = _CONFIGURED.max_in_flight
    shutdown_timeout: float = _CONFIGURED.shutdown_timeout
    http_address: str = ""
    jobs_watch_check: float = 10.0
    # How long a batch of claims or triggers waits for its answers before they count as errors.
    write_timeout: float = 5.0
    # Triggers carry CloudEvents headers with this source; empty: they carry none.
    cloudevents_source: str = ""
    # Replicas that hold each lane of jobs (core/partitions.py); 0: every replica holds every job.
    holders: int = _CONFIGURED.holders

    @property
    def max_clock_skew_ms(self) -> float:
        """``max_clock_skew`` in the milliseconds the engine's clocks count in."""
        return self.max_clock_skew * 1000
