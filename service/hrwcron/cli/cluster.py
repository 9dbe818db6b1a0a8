"""The verbs that read the cluster or fire a job through it: ``trigger``, ``backfill``,
``status`` and ``history`` (admin API)."""

from __future__ import annotations

import argparse
import shutil
from typing import TYPE_CHECKING

from hrwcron.cli.options import (
    CONNECTION,
    JOB,
    JSON,
    PREFIX,
    QUIET,
    history_count,
    iso,
    job_name,
    status_limit,
)
from hrwcron.cli.output import short, table
from hrwcron.cli.request import progress
from hrwcron.cli.verb import Group, Verb, arg

if TYPE_CHECKING:
    from hrwcron.admin.api import BackfillResult, HistoryReply, StatusReply, TriggerResult
    from hrwcron.admin.client import AdminClient

# Lines of a terminal that `status` keeps for everything but the job rows.
STATUS_CHROME = 10
MIN_STATUS_ROWS = 10


# --- trigger and backfill -----------------------------------------------------------------


async def _trigger(args: argparse.Namespace, admin: AdminClient) -> TriggerResult:
    wait = max(60.0, args.timeout) if args.id else None  # the id is looked up in the stream
    return await admin.trigger(args.name, args.id, timeout=wait)


def _show_trigger(args: argparse.Namespace, result: TriggerResult) -> list[str]:
    if result.outcome == "started":
        return [f"{result.tick}: published by {result.node} (due {short(result.due)})"]
    return [f"{result.tick}: already fired before; nothing published"]


TRIGGER = Verb(
    "trigger",
    help="fire a job now, outside its schedule (admin API)",
    description=(
        "Publish a trigger for JOB now, through the same claim and fenced publish as a "
        "scheduled tick. Its tick key is JOB:manual:ID; the same --id never fires twice "
        "while the trigger stream keeps the job's triggers (looking it up there takes a "
        "few seconds for a job that fires every second)."
    ),
    epilog="example:\n  hrwcron trigger reports.daily --id rerun-2026-03-07",
    args=(
        JOB,
        arg("--id", default="", help="idempotency id (default: generated)"),
        JSON,
        CONNECTION,
    ),
    request=_trigger,
    show=_show_trigger,
)


async def _backfill(args: argparse.Namespace, admin: AdminClient) -> BackfillResult:
    return await admin.backfill(
        args.name, args.start, args.end, dry_run=args.dry_run, timeout=max(120, args.timeout)
    )


def _show_backfill(args: argparse.Namespace, result: BackfillResult) -> list[str]:
    verb = "would publish" if result.dry_run else "published"
    lines = [f"  + {tick}" for tick in result.published]
    lines.append(
        f"{result.name}: {result.due} due instants; {verb} {len(result.published)}, "
        f"{len(result.present)} already fired, "
        f"{len(result.left_to_scheduler)} left to the scheduler"
    )
    return lines


BACKFILL = Verb(
    "backfill",
    help="publish a job's past due instants that never fired (admin API)",
    description=(
        "Publish every due instant of JOB from --from to --to (both included) with its "
        "normal tick key, skipping ticks the trigger stream already holds, so a backfill "
        "never duplicates a trigger and can be repeated. Instants inside the job's "
        "lateness window are left to the scheduler. At most 1000 instants per request."
    ),
    epilog=(
        "example:\n"
        "  hrwcron backfill reports.daily --from 2026-03-01T00:00:00Z "
        "--to 2026-03-07T00:00:00Z --dry-run"
    ),
    args=(
        JOB,
        arg("--from", dest="start", required=True, type=iso, metavar="ISO8601"),
        arg("--to", dest="end", required=True, type=iso, metavar="ISO8601"),
        arg("--dry-run", action="store_true", help="show what would be published"),
        JSON,
        CONNECTION,
    ),
    request=_backfill,
    show=_show_backfill,
)


# --- status -------------------------------------------------------------------------------


def _screenful(lines: int) -> int:
    return max(MIN_STATUS_ROWS, lines - STATUS_CHROME)


async def _status_pages(args: argparse.Namespace, admin: AdminClient) -> StatusReply:
    """The first page's members and summary with the jobs of as many pages as asked for."""
    from hrwcron.admin.api import MAX_STATUS

    wanted = None if args.all else args.limit or _screenful(shutil.get_terminal_size().lines)
    first: StatusReply | None = None
    with progress(args, "reading status") as bar:
        after = ""
        while True:
            left = MAX_STATUS if wanted is None else wanted - (len(first.jobs) if first else 0)
            page = await admin.status(
                args.name or "", args.prefix, min(left, MAX_STATUS), after=after, order="due"
            )
            if first is None:
                first = page
            else:
                first.jobs.extend(page.jobs)
            bar.set_total(wanted or first.total_jobs)
            bar.update(len(first.jobs))
            done = wanted is not None and len(first.jobs) >= wanted
            if not page.next or done:
                first.truncated = bool(page.next)
                first.next = page.next
                return first
            after = page.next


def _show_status(args: argparse.Namespace, reply: StatusReply) -> list[str]:
    state = "ready" if reply.ready else f"NOT READY ({reply.reason})"
    lines = [f"answered by {reply.node}: {state}, job digest {reply.digest}", ""]
    member_rows = [
        [
            m.node,
            "live" if m.live else "down",
            "yes" if m.ready else f"no: {m.reason}",
            f"{m.age_s:.1f}s",
            f"{m.weight:g}",
            ",".join(m.tags) or "-",
            m.digest + ("" if m.digest_matches else " (differs)"),
            str(m.jobs),
            m.version,
        ]
        for m in reply.members
    ]
    lines += table(
        ["MEMBER", "STATE", "READY", "AGE", "WEIGHT", "TAGS", "DIGEST", "JOBS", "VERSION"],
        member_rows,
    )
    lines += ["", *_summary_lines(reply), ""]
    job_rows = [
        [
            j.name,
            j.schedule + ("" if j.tz == "UTC" else f" ({j.tz})"),
            j.state + ("" if j.runs_left is None else f" ({j.runs_left} runs left)"),
            "paused" if j.paused else (j.owner or "NO CANDIDATE"),
            ",".join(j.order[1:]) or "-",
            short(j.next_fire),
            j.last.tick if j.last else "-",
            ",".join(j.tags) or "-",
        ]
        for j in reply.jobs
    ]
    lines += table(
        ["JOB", "SCHEDULE", "STATE", "OWNER", "FAILOVER", "NEXT", "LAST TRIGGER", "TAGS"],
        job_rows,
    )
    lines += [f"{j.name}: BAD: {j.problem}" for j in reply.jobs if j.problem]
    if reply.truncated:
        lines.append(
            f"showing the {len(reply.jobs):,} of {reply.total_jobs:,} jobs due soonest; "
            "--limit N for more, --all for every one"
        )
    return lines


def _summary_lines(reply: StatusReply) -> list[str]:
    s = reply.summary
    owned = ", ".join(f"{node} {count:,}" for node, count in s.owned.items()) or "nobody"
    if s.no_owner:
        owned += f"; {s.no_owner:,} with no eligible member"
    return [
        f"jobs: {s.jobs:,} ({s.paused:,} paused, {s.bad:,} bad); "
        f"missed in the last hour: {s.missed_last_hour:,}",
        f"owned: {owned}",
    ]


STATUS = Verb(
    "status",
    help="members, a summary, and the jobs due soonest with owner, failover and last trigger",
    description=(
        "Show the cluster as the answering replica sees it: every member with its "
        "heartbeat age, weight, tags and job-table digest; a summary of every job (how "
        "many, paused, bad specs, owned per member, ticks missed in the last hour); then "
        "the jobs due soonest, each with its owner, failover order, next firing and last "
        "trigger. The table shows what fits the terminal (--limit N for another count, "
        "--all for every job, paged through)."
    ),
    epilog=(
        "examples:\n"
        "  hrwcron status\n"
        "  hrwcron status --prefix reports. --limit 100\n"
        "  hrwcron status --all --json > status.json\n"
        "  hrwcron status reports.daily"
    ),
    args=(
        arg("name", metavar="JOB", nargs="?", type=job_name, help="one job only"),
        PREFIX,
        Group(
            exclusive=True,
            args=(
                arg(
                    "--limit",
                    type=status_limit,
                    metavar="N",
                    help="show the N jobs due soonest (default: as many as fit the terminal, "
                    f"{_screenful(24)} when it is not one)",
                ),
                arg("--all", action="store_true", help="show every job, soonest due first"),
            ),
        ),
        JSON,
        QUIET,
        CONNECTION,
    ),
    request=_status_pages,
    show=_show_status,
)


# --- history ------------------------------------------------------------------------------


async def _history(args: argparse.Namespace, admin: AdminClient) -> HistoryReply:
    return await admin.history(args.name, args.limit)


def _show_history(args: argparse.Namespace, reply: HistoryReply) -> list[str]:
    rows = [
        [
            str(t.seq),
            t.tick,
            t.kind,
            short(t.due),
            short(t.fired_at),
            t.node or "-",
            str(t.attempt),
        ]
        for t in reply.triggers
    ]
    if not rows:
        return [f"{reply.name}: no triggers in the stream on {reply.subject}"]
    return table(["SEQ", "TICK", "KIND", "DUE", "FIRED", "NODE", "ATTEMPT"], rows)


HISTORY = Verb(
    "history",
    help="the last triggers of a job, read from the trigger stream (admin API)",
    epilog="example:\n  hrwcron history reports.daily -n 5",
    args=(
        JOB,
        arg("-n", dest="limit", type=history_count, default=20, metavar="N", help="default 20"),
        JSON,
        CONNECTION,
    ),
    request=_history,
    show=_show_history,
)
