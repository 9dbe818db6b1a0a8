"""The verdict on a chaos run: every (job, due) of a time window checked against the trigger
stream, a summary table, and an exit status for scripts.

The checking itself is :func:`harness.audit.find_violations` (missing, duplicated, early by the
server's clock, late beyond ``max_lateness``, out of order per job, stray Msg-Ids, and ticks
the job's window, exclusions or ``max_runs`` rule out, all read from the job's own plan); this
module adds what a long run needs around it: how many ticks were checked, lateness figures, a
table a person can read, and a command line for a stream that is still on a server::

    python tests/chaos/checker.py --nats nats://127.0.0.1:4222 --since -10m --until -1m

which reads the job specs from the jobs bucket, checks the window and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: make ``harness`` and ``hrwcron`` importable like under pytest.
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats
from nats.aio.client import Client

from harness import wait_for_async
from harness.ackjournal import ACK_LOST, Ack, find_lost_acks
from harness.audit import EXCLUDED, OUTSIDE, RUNS, due_instants, expected_dues, first_copies
from harness.chaos import (
    DEFAULT_PREFIX,
    DEFAULT_STREAM,
    DUPLICATED,
    EARLY,
    LATE,
    MISSING,
    OUT_OF_ORDER,
    STRAY,
    Trigger,
    TriggerLog,
    Violation,
    find_violations,
)
from hrwcron.adapters.jetstream.kv import snapshot
from hrwcron.core.model import JobSpec, decode_job
from hrwcron.core.schedule import jitter_ms

KINDS = (MISSING, DUPLICATED, EARLY, LATE, OUT_OF_ORDER, STRAY, OUTSIDE, EXCLUDED, RUNS, ACK_LOST)
EARLY_TOLERANCE_MS = 50.0
# A replica decides before publishing that a tick is still within its lateness window; the
# server stores it a round trip later. Lateness is judged with the same tolerance as earliness.
LATE_TOLERANCE_MS = 50.0


@dataclass
class Verdict:
    """What one check found; ``ok`` only when nothing at all was violated."""

    jobs: list[JobSpec]
    window: tuple[float, float]
    ticks: int  # (job, due) pairs inside the window
    violations: list[Violation]
    # Server-stored time minus fire instant, for the first copy of each tick in the window.
    lateness_ms: list[float] = field(default_factory=list)
    triggers: Sequence[Trigger] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def percentile(self, q: float) -> float | None:
        if not self.lateness_ms:
            return None
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def worst_lateness_ms(self) -> float | None:
        return max(self.lateness_ms) if self.lateness_ms else None

    def table(self, *, per_job_limit: int = 20, examples: int = 10) -> str:
        """Markdown: totals per kind, the jobs with violations, and the first few of them."""
        counts = self.counts()
        start, end = (_iso(t) for t in self.window)
        lines = [
            f"{self.ticks} ticks of {len(self.jobs)} jobs due {start} .. {end}: "
            + ("no violations" if self.ok else f"{len(self.violations)} VIOLATIONS"),
            "",
            "| check | violations |",
            "|---|---:|",
            *(f"| {kind} | {counts.get(kind, 0)} |" for kind in KINDS),
        ]
        p50, p99, worst = self.percentile(0.5), self.percentile(0.99), self.worst_lateness_ms
        if worst is not None:
            lines += [
                "",
                f"lateness after the fire instant (server clock): p50 {p50:.0f} ms, "
                f"p99 {p99:.0f} ms, max {worst:.0f} ms",
            ]
        if self.violations:
            per_job: dict[str, Counter[str]] = {}
            for v in self.violations:
                per_job.setdefault(v.job, Counter())[v.kind] += 1
            lines += ["", "| job | " + " | ".join(KINDS) + " |", "|---|" + "---:|" * len(KINDS)]
            for job in sorted(per_job)[:per_job_limit]:
                row = " | ".join(str(per_job[job].get(kind, 0)) for kind in KINDS)
                lines.append(f"| {job} | {row} |")
            lines += ["", *(f"- {v}" for v in self.violations[:examples])]
            if len(self.violations) > examples:
                lines.append(f"- ... and {len(self.violations) - examples} more")
        return "\n".join(lines)


def check(
    triggers: Sequence[Trigger],
    jobs: Iterable[JobSpec],
    window: tuple[float, float],
    *,
    early_tolerance_ms: float = EARLY_TOLERANCE_MS,
    late_tolerance_ms: float = LATE_TOLERANCE_MS,
    acks: Iterable[Ack] = (),
) -> Verdict:
    """Every violation of ``triggers`` for ``jobs`` in ``window`` and, given the replicas'
    ``acks``, every acknowledged trigger that is no longer where it was acknowledged
    (ACK_LOST, whatever its due instant: a lost ack is a durability failure, not a tick's)."""
    specs = list(jobs)
    violations = find_violations(triggers, specs, window, early_tolerance_ms=early_tolerance_ms)
    start, end = window
    ticks = sum(
        len(expected_dues(spec, first_copies(triggers, spec.name), window)) for spec in specs
    )
    jitter = {spec.name: jitter_ms(spec.name, spec.jitter) for spec in specs}
    deadline = {spec.name: jitter[spec.name] + spec.max_lateness_ms for spec in specs}
    stored: dict[tuple[str, int], float] = {}
    for trigger in triggers:
        stored.setdefault((trigger.job, trigger.due_ms), trigger.stored_ms)
    violations = [
        v
        for v in violations
        if v.kind != LATE
        or stored[(v.job, v.due_ms)] - (v.due_ms + deadline[v.job]) > late_tolerance_ms
    ]
    first: dict[str, Trigger] = {}
    for trigger in triggers:
        if trigger.scheduled and trigger.job in jitter and start <= trigger.due_ms <= end:
            first.setdefault(trigger.msg_id, trigger)
    lateness = [t.stored_ms - (t.due_ms + jitter[t.job]) for t in first.values()]
    violations += lost_ack_violations(acks, triggers)
    return Verdict(specs, window, ticks, violations, lateness, triggers)


def lost_ack_violations(acks: Iterable[Ack], triggers: Sequence[Trigger]) -> list[Violation]:
    found = []
    for lost in find_lost_acks(acks, [(t.seq, t.msg_id) for t in triggers]):
        job, _, due = lost.ack.msg_id.rpartition(":")
        found.append(Violation(ACK_LOST, job, int(due) if due.isdigit() else 0, lost.detail))
    return found


def failover_times(
    triggers: Sequence[Trigger],
    jobs: Iterable[JobSpec],
    leaves: Iterable[tuple[str, float, str]],
    *,
    recent_ms: float = 3_000.0,
) -> list[tuple[str, float]]:
    """(kind, ms) per replica-removing fault: how late the first tick after it fired, worst
    over the jobs that replica had been firing (its last trigger before the fault, at most
    ``recent_ms`` old, was its own). ``leaves`` are (node, instant ms, kind)."""
    jitter = {spec.name: jitter_ms(spec.name, spec.jitter) for spec in jobs}
    per_job: dict[str, list[Trigger]] = {}
    for trigger in triggers:
        if trigger.scheduled and trigger.job in jitter:
            per_job.setdefault(trigger.job, []).append(trigger)
    stored = {job: [t.stored_ms for t in ts] for job, ts in per_job.items()}
    fires = {job: [t.due_ms + jitter[job] for t in ts] for job, ts in per_job.items()}
    found: list[tuple[str, float]] = []
    for node, instant, kind in leaves:
        worst: float | None = None
        for job, ts in per_job.items():
            before = bisect.bisect_left(stored[job], instant) - 1
            if before < 0 or ts[before].node != node or ts[before].stored_ms < instant - recent_ms:
                continue
            after = bisect.bisect_left(fires[job], instant)
            if after >= len(ts):
                continue
            late = ts[after].stored_ms - fires[job][after]
            worst = late if worst is None else max(worst, late)
        if worst is not None:
            found.append((kind, worst))
    return found


def failover_table(times: Sequence[tuple[str, float]]) -> str:
    """Markdown: per fault kind, how many measured and the median and worst failover."""
    by_kind: dict[str, list[float]] = {}
    for kind, ms in times:
        by_kind.setdefault(kind, []).append(ms)
    lines = ["| fault | measured | median | max |", "|---|---:|---:|---:|"]
    for kind in sorted(by_kind):
        values = sorted(by_kind[kind])
        median = values[len(values) // 2]
        lines.append(f"| {kind} | {len(values)} | {median:.0f} ms | {values[-1]:.0f} ms |")
    return "\n".join(lines)


async def check_stream(
    client: Client,
    jobs: Iterable[JobSpec],
    window: tuple[float, float],
    *,
    stream: str = DEFAULT_STREAM,
    subject_prefix: str = DEFAULT_PREFIX,
    settle_timeout: float = 60.0,
    acks: Iterable[Ack] = (),
) -> Verdict:
    """Wait until every job's ticks up to the window's end are settled in the stream (a job's
    ticks are published in due order, so its last tick of the window settles the earlier ones;
    a job whose window closed, whose one time has passed or whose runs are used up has nothing
    more to wait for; a job that cannot get there is judged anyway and shows as missing), then
    check."""
    specs = list(jobs)
    log = TriggerLog(client, stream=stream, subject_prefix=subject_prefix)
    last = {spec.name: (due_instants(spec, window[0], window[1]) or [None])[-1] for spec in specs}

    def settled(spec: JobSpec) -> bool:
        due = last[spec.name]
        if due is None:
            return True
        runs = first_copies(log.triggers, spec.name)
        if spec.max_runs is not None and len(runs) >= spec.max_runs:
            return True
        return (log.newest_due(spec.name) or 0) >= due

    async def covered() -> bool:
        await log.read(timeout=10)
        return all(settled(spec) for spec in specs)

    try:
        await wait_for_async(
            covered,
            timeout=settle_timeout,
            interval=0.2,
            message=f"triggers of {len(specs)} jobs settled up to {window[1]:.0f}",
            ignore=(TimeoutError, nats.errors.Error),
        )
    except AssertionError:
        await log.read()
    return check(log.triggers, specs, window, acks=acks)


async def jobs_in_bucket(client: Client, bucket: str = "hrwcron_jobs") -> list[JobSpec]:
    """The valid, unpaused job specs stored in the jobs bucket."""
    entries = []
    for attempt in range(3):
        try:
            entries = await snapshot(client.jetstream(), bucket)
            break
        except TimeoutError:
            # Its read answers late on a busy machine: ask again, and fail loudly rather
            # than check nothing.
            if attempt == 2:
                raise
    found: list[JobSpec] = []
    for entry in entries:
        try:
            spec = decode_job(entry.value or b"", where=entry.key)
        except Exception:
            continue
        if not spec.paused and not spec.problems():
            found.append(spec)
    return found


# --- command line -----------------------------------------------------------------------------

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smh])$")


def parse_instant(text: str, now_ms: float | None = None) -> float:
    """Epoch ms from ``1800000000000``, an RFC 3339 instant, or ``-10m`` (before now)."""
    now = time.time() * 1000 if now_ms is None else now_ms
    relative = _RELATIVE.match(text)
    if relative:
        unit = {"s": 1_000, "m": 60_000, "h": 3_600_000}[relative.group(2)]
        return now - float(relative.group(1)) * unit
    if text.isdigit():
        return float(text)
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not epoch ms, an RFC 3339 instant or -<N>s/m/h"
        ) from None
    if instant.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone")
    return instant.timestamp() * 1000


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="checker",
        description="Check a trigger stream for missing, duplicated, early, late and "
        "out-of-order ticks; exit 1 on any violation.",
    )
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="server URL(s), comma-joined")
    p.add_argument("--since", required=True, help="window start: epoch ms, RFC 3339 or -10m")
    p.add_argument("--until", default="-0s", help="window end (default: now)")
    p.add_argument("--stream", default=DEFAULT_STREAM)
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="trigger subject prefix")
    p.add_argument("--jobs-bucket", default="hrwcron_jobs")
    p.add_argument(
        "--job", action="append", default=[], help="only this job (repeatable); default: all"
    )
    p.add_argument("--settle", type=float, default=30.0, help="seconds to wait for the window")
    return p


async def _main(args: argparse.Namespace) -> int:
    try:
        window = (parse_instant(args.since), parse_instant(args.until))
    except argparse.ArgumentTypeError as exc:
        print(f"checker: {exc}", file=sys.stderr)
        return 2
    client = await nats.connect(args.nats.split(","), connect_timeout=5, max_reconnect_attempts=3)
    try:
        specs = await jobs_in_bucket(client, args.jobs_bucket)
        if args.job:
            specs = [s for s in specs if s.name in set(args.job)]
        if not specs:
            print("checker: no jobs to check", file=sys.stderr)
            return 2
        verdict = await check_stream(
            client,
            specs,
            window,
            stream=args.stream,
            subject_prefix=args.prefix,
            settle_timeout=args.settle,
        )
    finally:
        await client.close()
    print(verdict.table())
    return verdict.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(_main(_parser().parse_args(argv)))


__all__ = [
    "KINDS",
    "Verdict",
    "check",
    "check_stream",
    "failover_table",
    "failover_times",
    "jobs_in_bucket",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
