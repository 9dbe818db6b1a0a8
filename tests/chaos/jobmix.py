"""The jobs a chaos run audits: many ticks per second from plain schedules, and jobs whose plan
has a shape of its own (a window that opens and closes during the run, exclusions, one-time
``@at`` jobs, a run limit), so a fault that makes a replica misread a plan shows as a tick
that fired where it must not (or did not where it must).

Every instant is placed relative to ``begin_ms`` (when the jobs are written, before the
replicas start) over ``span_s`` (about how long the run lasts), on whole seconds.
"""

from __future__ import annotations

import datetime as dt

from hrwcron.core.model import JobSpec

from .faults import Timings

PLAN_PREFIX = "plan."


def iso(ms: float) -> str:
    """An RFC 3339 instant in UTC, whole seconds."""
    return dt.datetime.fromtimestamp(int(ms // 1000), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def local(ms: float) -> str:
    """A local wall time of a UTC job, as exclusion ranges take it."""
    return dt.datetime.fromtimestamp(int(ms // 1000), dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def plain_jobs(t: Timings) -> list[JobSpec]:
    """Every-second jobs (most ticks per second of run), 6-field cron with seconds, and jittered
    ones; catch-up ``all`` everywhere, so every due tick of the window must be in the stream."""
    late = t.max_lateness
    jobs = [JobSpec(name=f"sec{i:02d}", schedule="@every 1s", max_lateness=late) for i in range(10)]
    jobs += [
        JobSpec(name=f"cron.even{i}", schedule="*/2 * * * * *", max_lateness=late) for i in range(3)
    ]
    jobs += [
        JobSpec(name=f"jit{i}", schedule="@every 3s", jitter=0.8, max_lateness=late)
        for i in range(2)
    ]
    return jobs


def plan_jobs(t: Timings, begin_ms: float, span_s: float) -> list[JobSpec]:
    """One of each plan shape, spread over the run."""
    late = t.max_lateness
    second = 1000.0
    opens = begin_ms + max(10.0, span_s * 0.15) * second
    closes = opens + max(20.0, span_s * 0.5) * second
    gap = begin_ms + max(25.0, span_s * 0.4) * second
    count = max(4, min(40, int(span_s // 20)))
    step = max(5.0, span_s * 0.8 / count) * second
    runs = max(6, int(span_s * 0.3 // 2))
    jobs = [
        JobSpec(
            name=f"{PLAN_PREFIX}window",
            schedule="@every 1s",
            start=iso(opens),
            end=iso(closes),
            max_lateness=late,
        ),
        # Every third second, and a stretch of local time, are excluded.
        JobSpec(
            name=f"{PLAN_PREFIX}excluded",
            schedule="* * * * * *",
            exclude=["*/3 * * * * *", f"{local(gap)}..{local(gap + 10 * second)}"],
            max_lateness=late,
        ),
        JobSpec(name=f"{PLAN_PREFIX}runs", schedule="@every 2s", max_runs=runs, max_lateness=late),
    ]
    jobs += [
        JobSpec(
            name=f"{PLAN_PREFIX}at{i:02d}",
            schedule=f"@at {iso(begin_ms + 8 * second + i * step)}",
            max_lateness=late,
        )
        for i in range(count)
    ]
    return jobs


def chaos_jobs(t: Timings, begin_ms: float, span_s: float) -> list[JobSpec]:
    return plain_jobs(t) + plan_jobs(t, begin_ms, span_s)


def describe(jobs: list[JobSpec]) -> str:
    """For a report: how many jobs of which shape."""
    plain = [j for j in jobs if not j.name.startswith(PLAN_PREFIX)]
    at = [j for j in jobs if j.schedule.startswith("@at")]
    return (
        f"{len(jobs)} jobs ({len(plain)} plain: 10 every second, 3 six-field cron every 2 s, "
        "2 every 3 s with jitter; and a window that opens and closes during the run, a job "
        f"with exclusions, one with max_runs, {len(at)} one-time @at jobs)"
    )
