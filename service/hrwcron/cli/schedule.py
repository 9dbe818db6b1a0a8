"""The verbs that need no cluster (except ``next JOB``): ``next``, ``owner``, ``check-config`` and
``hash-password``.

They report bad input by raising :class:`~hrwcron.core.errors.InvalidInput` and compute
everything before they print, so a failing command leaves stdout empty.
"""

from __future__ import annotations

import argparse
import getpass
import math
import os
import sys
import time
from typing import TYPE_CHECKING

from hrwcron.cli.options import CONNECTION, count, instant
from hrwcron.cli.output import emit, format_instant, plural
from hrwcron.cli.request import EXIT_OK, run_admin
from hrwcron.cli.verb import Verb, arg
from hrwcron.core.config import config_warnings, load_config, node_id_problem
from hrwcron.core.errors import InvalidInput, Problem, ScheduleError
from hrwcron.core.explain import exhausted_note, explain_next, why_fewer
from hrwcron.core.hrw import rank, weighted_rank
from hrwcron.core.model import JobSpec, job_name_problem
from hrwcron.core.passwords import hash_password
from hrwcron.core.plan import TickPlan
from hrwcron.process.host import node_id

if TYPE_CHECKING:
    from hrwcron.admin.client import AdminClient


# Where the window and exclusion problems of a plan come from on this command line.
_NEXT_FLAGS = {"start": "--start", "end": "--end", "tz": "tz"}


def _cmd_next(args: argparse.Namespace) -> int:
    if job_name_problem(args.expr) is None:
        # One token without '@' is never a schedule, so it names a job; the admin API has it.
        if args.job is not None:
            raise InvalidInput("JOB already names the job; --job goes with an expression", "--job")
        for flag in ("start", "end"):
            if getattr(args, flag) is not None:
                raise InvalidInput(f"a job has its own {flag}; drop --{flag}", f"--{flag}")
        if args.exclude:
            raise InvalidInput("a job has its own exclusions; drop --exclude", "--exclude")
        return _next_of_job(args)
    if args.job is not None:
        bad_job = job_name_problem(args.job)
        if bad_job:
            raise InvalidInput(bad_job, "--job")
    spec = JobSpec(
        name=args.job or "",
        schedule=args.expr,
        tz=args.tz or "UTC",
        start=args.start,
        end=args.end,
        exclude=list(args.exclude),
    )
    return _print_next(args, spec, None)


def _plan(spec: JobSpec) -> TickPlan:
    try:
        return TickPlan.parse(
            spec.schedule,
            spec.tz,
            job=spec.name or None,
            start=spec.start,
            end=spec.end,
            exclude=spec.exclude,
        )
    except ScheduleError as exc:
        if exc.field == "job":
            raise InvalidInput(
                f"{exc.problems[0].message}; name the job with --job NAME", "--job"
            ) from None
        problems = []
        for p in exc.problems:
            where = _NEXT_FLAGS.get(p.where, p.where)
            if p.where.startswith("exclude["):
                where = "--exclude"
            problems.append(Problem(where, p.message))
        raise InvalidInput(problems) from None


def _print_next(args: argparse.Namespace, spec: JobSpec, runs_left: int | None) -> int:
    plan = _plan(spec)
    at: int = time.time_ns() // 1_000_000 if args.after is None else args.after
    found = explain_next(plan, at, args.count, runs_left)
    lines: list[str] = []
    for tick in found.instants:
        if tick.fires:
            lines.append(format_instant(tick.due) + ("  fires" if args.explain else ""))
        elif args.explain:
            tail = f", and every tick before {format_instant(tick.until)}" if tick.until else ""
            lines.append(f"{format_instant(tick.due)}  excluded by {tick.rule!r}{tail}")
    emit(lines)
    if found.exhausted:
        print(f"hrwcron next: {exhausted_note(found, format_instant)}", file=sys.stderr)
    elif found.found < args.count:
        why = why_fewer(plan, found, runs_left, format_instant)
        print(f"hrwcron next: {why}", file=sys.stderr)
    return EXIT_OK


def _next_of_job(args: argparse.Namespace) -> int:
    """``next JOB``: the job's spec, and its runs left when it has max_runs, read through the
    API, then its instants as for an expression."""
    if args.tz is not None:
        raise InvalidInput("a job's schedule uses the job's own time zone; drop --tz", "--tz")
    found: list[tuple[JobSpec, int | None]] = []

    async def work(admin: AdminClient) -> int:
        entry = await admin.get_job(args.expr)
        if entry.spec is None:
            raise InvalidInput(f"job {args.expr!r} is stored but invalid: {entry.error}", "JOB")
        left = None
        if entry.spec.max_runs is not None:
            reply = await admin.status(args.expr, limit=1)
            left = reply.jobs[0].runs_left if reply.jobs else None
        found.append((entry.spec, left))
        return EXIT_OK

    code = run_admin(args, work)
    if code != EXIT_OK:
        return code
    spec, left = found[0]
    return _print_next(args, spec, left)


def _cmd_owner(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    bad_job = job_name_problem(args.job)
    if bad_job:
        problems.append(Problem("JOB", bad_job))
    nodes = _nodes(args.nodes, problems)
    weights = _weights(args.weights, nodes, problems) if args.weights is not None else None
    if problems:
        raise InvalidInput(problems)
    if weights is None:
        order = rank(args.job, nodes)
    else:
        order = weighted_rank(args.job, {node: weights.get(node, 1.0) for node in nodes})
    emit(order)
    return EXIT_OK


def _nodes(text: str, problems: list[Problem]) -> list[str]:
    nodes = [part.strip() for part in text.split(",")]
    seen: set[str] = set()
    for node in nodes:
        bad = node_id_problem(node)
        if bad:
            problems.append(Problem("--nodes", bad))
        elif node in seen:
            problems.append(Problem("--nodes", f"{node!r} is listed twice"))
        seen.add(node)
    return nodes


def _weights(text: str, nodes: list[str], problems: list[Problem]) -> dict[str, float]:
    weights: dict[str, float] = {}
    for item in text.split(","):
        node, eq, raw = (part.strip() for part in item.partition("="))
        try:
            weight = float(raw) if eq else math.nan
        except ValueError:
            weight = math.nan
        if node not in nodes:
            problems.append(Problem("--weights", f"{node!r} is not one of --nodes"))
        elif not (weight > 0 and math.isfinite(weight)):
            problems.append(Problem("--weights", f"{item.strip()!r}: expected NODE=WEIGHT, >0"))
        else:
            weights[node] = weight
    return weights


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file, {} if args.no_env else os.environ)
    for warning in config_warnings(config):
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    emit([f"{args.file}: OK: {plural(len(config.jobs), 'job')}, node id {node_id(config)}"])
    return EXIT_OK


NEXT = Verb(
    "next",
    help="print the next due instants of a schedule",
    description=(
        "Print the next due instants of a cron schedule, one UTC ISO-8601 instant per "
        "line, evaluated in a time zone with hrwcron's daylight-saving rules. --start, "
        "--end and --exclude apply a job's window and exclusions; fewer lines than --count "
        "mean the schedule ends (a note on stderr says why)."
    ),
    epilog=(
        "examples:\n"
        "  hrwcron next '30 2 * * *' --tz America/New_York --after 2026-03-07T12:00:00Z\n"
        "  hrwcron next '@every 90s' --count 5\n"
        "  hrwcron next '0 0 9 * * MON-FRI' --tz Europe/Berlin  (6 fields: seconds first)\n"
        "  hrwcron next '0 0 L * *' --count 3  (the last day of each month)\n"
        "  hrwcron next '0 9 * * 1#2'  (the second Monday; 5L is the last Friday)\n"
        "  hrwcron next 'H H * * *' --job reports.daily  (H is hashed from the job's name)\n"
        "  hrwcron next '@at 2026-12-24T09:00:00' --tz Europe/Berlin  (once)\n"
        "  hrwcron next '0 9 * * *' --exclude '* * 25 12 *' --exclude 2026-12-31 --explain\n"
        "  hrwcron next '0 * * * *' --start 2026-03-01T00:00:00Z --end 2026-03-31T23:00:00Z\n"
        "  hrwcron next reports.daily --count 3  (a job's schedule, read from the cluster)"
    ),
    args=(
        arg(
            "expr",
            metavar="EXPR|JOB",
            help="cron expression, macro, '@every DURATION', '@at TIME', or the name of a job",
        ),
        arg("--tz", metavar="ZONE", help="IANA time zone (default: UTC)"),
        arg(
            "--job",
            metavar="NAME",
            help="the job name that H in EXPR is hashed from (a job from the cluster uses its own)",
        ),
        arg(
            "--after",
            type=instant,
            metavar="ISO8601",
            help="start strictly after this instant; needs 'Z' or an offset (default: now)",
        ),
        arg("--count", type=count, default=1, metavar="N", help="how many instants (default: 1)"),
        arg("--start", metavar="RFC3339", help="no tick before this instant (a job's start)"),
        arg("--end", metavar="RFC3339", help="no tick after this instant (a job's end)"),
        arg(
            "--exclude",
            action="append",
            default=[],
            metavar="RULE",
            help="leave out ticks on these local times: a cron expression or a date range such "
            "as 2026-12-24..2026-12-26 (repeatable)",
        ),
        arg(
            "--explain",
            action="store_true",
            help="also list the excluded ticks with the rule that excludes them",
        ),
        CONNECTION,
    ),
    run=_cmd_next,
)

OWNER = Verb(
    "owner",
    help="rank nodes for a job: owner first, then failover order",
    description=(
        "Print the rendezvous-hash (HRW) order of NODES for JOB, one node per line: the "
        "owner first, then the replicas that take over one failover step after another."
    ),
    epilog="example:\n  hrwcron owner reports.daily --nodes a,b,c --weights a=1,b=2",
    args=(
        arg("job", metavar="JOB", help="job name"),
        arg("--nodes", required=True, metavar="A,B,C", help="comma-separated node ids"),
        arg(
            "--weights",
            metavar="A=W,...",
            help="capacity weights (> 0) for weighted HRW; unlisted nodes weigh 1",
        ),
    ),
    run=_cmd_owner,
)

CHECK_CONFIG = Verb(
    "check-config",
    help="validate a configuration file and its jobs",
    description=(
        "Validate a TOML configuration file, overlaid with HRWCRON_* environment variables "
        "as the service would load it. Prints every problem as 'FILE: where: message' and "
        "exits 2, or prints a one-line summary and exits 0."
    ),
    args=(
        arg("file", metavar="FILE", help="path of the TOML configuration file"),
        arg("--no-env", action="store_true", help="ignore HRWCRON_* environment variables"),
    ),
    run=_cmd_check_config,
)


def _cmd_hash_password(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise InvalidInput("the two passwords differ", "password")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 8:
        raise InvalidInput("must be at least 8 characters", "password")
    encoded = hash_password(password)
    emit([f"{args.user}:{encoded}" if args.user else encoded])
    return EXIT_OK


HASH_PASSWORD = Verb(
    "hash-password",
    help="hash a console user's password for http.users",
    description=(
        "Read a password (asked twice on a terminal, else the first line of stdin) and print "
        "its scrypt hash, or NAME:HASH with --user: one entry of http.users, the console's "
        "users who may act on jobs. The password itself is never printed or stored."
    ),
    epilog=(
        "example:\n"
        "  hrwcron hash-password --user alice\n"
        '  # then in the replica\'s config: [http] users = ["alice:scrypt$..."]'
    ),
    args=(arg("--user", metavar="NAME", help="print NAME:HASH, ready for http.users"),),
    run=_cmd_hash_password,
)
