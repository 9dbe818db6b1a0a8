"""Durations (``90s``, ``1h30m``, ``250ms``) as written in ``@every`` and in settings, the
limits of ``@every``, and a job's fixed jitter offset."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import xxhash

from hrwcron.core.schedule.civil import schedule_error

MIN_EVERY_MS = 1_000
# Longer intervals tick so rarely that their next tick can lie beyond the supported years.
MAX_EVERY_MS = 366 * 86_400_000


_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


def duration_ms(text: str) -> Fraction:
    """Exact milliseconds in ``text``: one or more <number><unit> with units h, m, s, ms."""
    rule = "use numbers with units h, m, s or ms, e.g. 90s, 5m, 1h30m, 250ms"
    if not isinstance(text, str) or not text.strip():
        raise schedule_error("duration", f"empty duration: {rule}")
    body = text.strip()
    if not _DURATION.fullmatch(body):
        raise schedule_error("duration", f"{text!r} is not a duration: {rule}")
    return sum(
        (Fraction(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(body)), start=Fraction(0)
    )


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``5m``, ``1h30m``, ``250ms``, ``1.5h``."""
    return float(duration_ms(text) / 1000)


def jitter_ms(job: str, jitter_seconds: float) -> int:
    """The job's fixed offset in ``[0, jitter)`` ms: ``xxh3_64(utf8(job)) mod floor(jitter*1000)``.

    Every replica derives the same value from the name alone; 0 when there is no jitter."""
    if not math.isfinite(jitter_seconds) or jitter_seconds < 0:
        raise schedule_error(
            "jitter", f"must be a finite number of seconds >= 0, not {jitter_seconds!r}"
        )
    span = int(jitter_seconds * 1000)
    if span <= 0:
        return 0
    return int(xxhash.xxh3_64_intdigest(job.encode("utf-8")) % span)
