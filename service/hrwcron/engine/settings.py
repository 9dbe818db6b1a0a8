"""A replica's engine settings: identity, timings and limits, as the composition root sets them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    node_id: str
    weight: float = 1.0
    tags: tuple[str, ...] = ()
    heartbeat_interval: float = 1.0
    member_ttl: float = 3.0
    membership_refresh: float = 1.0
    failover_step: float = 1.0
    claim_lease: float = 2.0
    max_clock_skew: float = 1.0
    subject_prefix: str = "hrwcron.trigger"
    max_payload: int = 64 * 1024
    max_in_flight: int = 512
    shutdown_timeout: float = 5.0
    http_address: str = ""
    jobs_watch_check: float = 10.0
    # How long a batch of claims or triggers waits for its answers before they count as errors.
    write_timeout: float = 5.0
    # Triggers carry CloudEvents headers with this source; empty: they carry none.
    cloudevents_source: str = ""
    # Replicas that hold each lane of jobs (core/partitions.py); 0: every replica holds every job.
    holders: int = 0
