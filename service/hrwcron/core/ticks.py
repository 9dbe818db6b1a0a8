"""Tick identity: the name of one occurrence of one job, shared by every replica."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, order=True, slots=True)
class TickId:
    """A job's occurrence at its nominal due instant (before jitter), in epoch milliseconds."""

    job: str
    due_ms: int

    @property
    def key(self) -> str:
        """``<job>:<due ms>``: the trigger's ``Nats-Msg-Id`` and the claim's identity."""
        return f"{self.job}:{self.due_ms}"

    @property
    def claim_key(self) -> str:
        """The claims-bucket key of this tick, shared by the scheduler and backfill."""
        return claim_key(self.job, CLAIM_DUE, str(self.due_ms))

    @property
    def due(self) -> datetime:
        return datetime.fromtimestamp(self.due_ms / 1000, tz=UTC)

    @classmethod
    def parse(cls, key: str) -> TickId:
        """Inverse of :attr:`key` for scheduled ticks; raises ValueError on anything else."""
        job, sep, due = key.rpartition(":")
        if not sep or not job or not due.isdigit():
            raise ValueError(f"not a scheduled tick key: {key!r}")
        return cls(job, int(due))


# Kinds of claim: a nominal due instant (scheduled ticks and backfill), or a manual trigger id.
CLAIM_DUE = "due"
CLAIM_MANUAL = "manual"


def claim_key(job: str, kind: str, value: str) -> str:
    """``<job>.<kind>.<value>``: KV keys allow dots but not colons. ``kind`` and ``value`` are
    one token each, so the last two tokens always give them back and the rest is the job: no
    two (job, occurrence) pairs share a key, whatever the job names and trigger ids."""
    return f"{job}.{kind}.{value}"


def manual_claim_key(job: str, trigger_id: str) -> str:
    return claim_key(job, CLAIM_MANUAL, trigger_id)


def format_ms(epoch_ms: int) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-03-08T07:00:00.000Z``. Three of these go
    into every trigger, so it avoids ``strftime``."""
    seconds, ms = divmod(int(epoch_ms), 1000)
    t = time.gmtime(seconds)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
        f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{ms:03d}Z"
    )


def parse_instant(text: str) -> int:
    """An ISO-8601 instant with ``Z`` or a UTC offset, as epoch milliseconds; ValueError says
    what is wrong."""
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO-8601 instant such as 2026-03-07T12:00:00Z"
        ) from None
    if dt.tzinfo is None:
        # A wall-clock time without a zone names a different instant on every machine.
        raise ValueError(f"{text!r} has no UTC offset; add 'Z' or an offset such as '+01:00'")
    return to_ms(dt)


def to_ms(dt: datetime) -> int:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: give a time zone (aware datetime) or epoch milliseconds")
    return (dt - _EPOCH) // _MS
