"""Operator commands over the admin API: ``jobs``, ``trigger``, ``backfill``, ``status``,
``history`` and ``apply``.

Every command talks to whichever replica answers ``hrwcron.admin.<verb>``, so it needs nothing
but a NATS connection (``--config FILE``, ``--nats-url URL`` or ``HRWCRON_NATS_URL``) and the
permission to publish on those subjects. Output is a table for people; ``--json`` prints the
API's reply for scripts. Exit codes: 0 done, 2 the request was refused (bad input, unknown
job, stale revision), 1 the cluster could not serve it (no replica, timeout, server error).
Commands that page through many jobs or write many show a progress bar on stderr while they
run, when stderr is a terminal (``--quiet`` turns it off).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from hrwcron.cli.progress import Progress
from hrwcron.core.config import ENV_CONFIG_PATH, Config, load_config, redact_url
from hrwcron.core.errors import HrwcronError, InvalidInput, NatsSetupError, Problem
from hrwcron.core.model import MAX_PAYLOAD_DEPTH, JobSpec, job_name_problem, json_depth
from hrwcron.core.ticks import format_ms, parse_instant

if TYPE_CHECKING:
    from hrwcron.admin.api import JobOutcome, StatusReply
    from hrwcron.admin.client import AdminClient
    from hrwcron.cli import Subparsers

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_REFUSED = 2
# Lines of a terminal that `status` keeps for everything but the job rows.
STATUS_CHROME = 10
MIN_STATUS_ROWS = 10
_TOO_DEEP = f"nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep"
_FORMATTER = argparse.RawDescriptionHelpFormatter


# --- shared plumbing ----------------------------------------------------------------------


def add_connection_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("connection")
    group.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_PATH),
        help=f"TOML configuration file for the NATS connection (default: ${ENV_CONFIG_PATH})",
    )
    group.add_argument(
        "--nats-url",
        metavar="URL",
        help="NATS server URL(s), comma-separated (default: HRWCRON_NATS_URL, the config file, "
        "or nats://127.0.0.1:4222)",
    )
    group.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for a replica's answer (default: 5)",
    )


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the API reply as JSON")


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar (shown on stderr when it is a terminal and the command takes "
        "more than a second)",
    )


def _progress(args: argparse.Namespace, label: str, total: int | None = None) -> Progress:
    enabled = False if getattr(args, "quiet", False) else None
    width = shutil.get_terminal_size().columns
    return Progress(label, total, stream=sys.stderr, enabled=enabled, width=width)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("must be a number of seconds from 0 to 3600")
    return value


def _revision(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError("must be a whole number >= 0 (0: create only)")
    return value


def _job_name(text: str) -> str:
    problem = job_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _iso(text: str) -> str:
    try:
        return format_ms(parse_instant(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def connection_config(args: argparse.Namespace, fallback: str | None = None) -> Config:
    """The configuration whose ``nats`` section says how to connect: ``--config`` (or
    ``fallback``), environment variables, then ``--nats-url`` over everything."""
    env = dict(os.environ)
    if getattr(args, "nats_url", None):
        env["HRWCRON_NATS_URL"] = args.nats_url
        env.pop("HRWCRON_NATS_SERVERS", None)
    return load_config(args.config or fallback, env)


def run_admin(
    args: argparse.Namespace,
    work: Callable[[AdminClient], Awaitable[int]],
    *,
    config: Config | None = None,
) -> int:
    """Connect, run ``work`` with an admin client, and turn errors into exit codes: a refused
    request raises InvalidInput (exit 2 in ``cli.main``), anything else prints and exits 1."""
    from hrwcron.adapters.jetstream.connect import connect
    from hrwcron.admin.api import CALLER_ERRORS
    from hrwcron.admin.client import AdminClient, AdminError

    config = config or connection_config(args)

    async def main() -> int:
        # The shared connect retries forever (right for a replica); a command gives up.
        try:
            client = await asyncio.wait_for(
                connect(config.nats, name_suffix="-cli"), timeout=args.timeout
            )
        except TimeoutError:
            servers = ", ".join(redact_url(s) for s in config.nats.servers)
            raise NatsSetupError(
                f"cannot connect to NATS at {servers} within {args.timeout:g} s"
            ) from None
        try:
            return await work(AdminClient(client, timeout=args.timeout))
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except AdminError as exc:
        if exc.code in CALLER_ERRORS:
            problems = [Problem(f, m) for f, m in exc.problems] or [Problem("", exc.message)]
            raise InvalidInput(problems) from None
        _fail(args, exc.message)
    except InvalidInput:
        raise
    except HrwcronError as exc:
        _fail(args, str(exc))
    return EXIT_SERVER


def _fail(args: argparse.Namespace, message: str) -> None:
    print(f"hrwcron {args.command}: error: {message}", file=sys.stderr)


def _print_json(reply: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(reply), indent=2).decode() + "\n")
    sys.stdout.flush()


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


def _emit(lines: Sequence[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


def _short(instant: str | None) -> str:
    return "-" if not instant else instant.replace(".000Z", "Z")


# --- jobs ---------------------------------------------------------------------------------


def add_jobs(sub: Subparsers) -> None:
    p = sub.add_parser(
        "jobs",
        help="list, show, write, delete, pause and resume jobs (admin API)",
        description="Manage the jobs every replica runs. Changes are live within a second.",
        epilog=(
            "examples:\n"
            "  hrwcron jobs ls\n"
            "  hrwcron jobs get reports.daily --json\n"
            "  hrwcron jobs put reports.daily --schedule '30 2 * * *' --tz America/New_York\n"
            "  hrwcron jobs put remind.xmas --schedule '@at 2026-12-24T09:00:00' "
            "--tz Europe/Berlin --delete-after 86400\n"
            "  hrwcron jobs put campaign --schedule '0 * * * *' --start 2026-03-01T00:00:00Z "
            "--end 2026-03-31T23:00:00Z --exclude '* 0-6 * * *'\n"
            "  hrwcron jobs put -f job.json --revision 7   (refused if someone changed it)\n"
            "  hrwcron jobs put -f jobs.json   (a JSON array: many jobs, written together)\n"
            "  hrwcron jobs pause reports.daily\n"
            "  hrwcron jobs rm reports.daily"
        ),
        formatter_class=_FORMATTER,
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    ls = verbs.add_parser("ls", help="list jobs")
    ls.add_argument("--prefix", default="", help="only jobs whose name starts with this")
    _add_quiet(ls)
    ls.set_defaults(handler=_cmd_jobs_ls)

    get = verbs.add_parser("get", help="show one job and its revision")
    get.add_argument("name", metavar="JOB", type=_job_name)
    get.set_defaults(handler=_cmd_jobs_get)

    put = verbs.add_parser(
        "put",
        help="create or replace a job",
        description=(
            "Create or replace a job from flags or from a JSON file (-f FILE, '-' for stdin) "
            "holding one job spec. With --revision N the write only happens if the job is "
            "still at revision N (0: only if it does not exist). A file holding a JSON array "
            "of job specs writes them all, in requests as large as the server allows with "
            "several in flight; each job is answered on its own (created, updated, unchanged, "
            "or refused with its problems) and a refused one does not stop the others. "
            "--atomic first has every job checked and writes nothing if any is refused; "
            "a job that a concurrent writer changes between that check and its write is "
            "still reported on its own, as a conflict."
        ),
    )
    put.add_argument("name", metavar="JOB", nargs="?", type=_job_name)
    put.add_argument("-f", "--file", metavar="FILE", help="JSON job spec ('-' for stdin)")
    put.add_argument("--schedule", metavar="EXPR", help="cron expression or '@every 5m'")
    put.add_argument("--tz", metavar="ZONE", help="IANA time zone (default UTC)")
    put.add_argument("--payload", metavar="JSON", help="static payload, any JSON value")
    put.add_argument("--max-lateness", type=float, metavar="SECONDS")
    put.add_argument("--jitter", type=float, metavar="SECONDS")
    put.add_argument("--catchup", choices=("all", "latest"))
    put.add_argument("--overlap", choices=("allow", "skip"))
    put.add_argument("--tags", metavar="A,B", help="members must carry all of these tags")
    put.add_argument("--subject", metavar="SUBJECT", help="trigger subject (default per job)")
    put.add_argument("--description", metavar="TEXT")
    put.add_argument("--paused", action="store_true", help="write the job paused")
    put.add_argument("--start", metavar="RFC3339", help="no tick before this instant")
    put.add_argument("--end", metavar="RFC3339", help="no tick after this instant")
    put.add_argument(
        "--exclude",
        action="append",
        metavar="RULE",
        help="skip ticks on these local times: a cron expression or a date range such as "
        "2026-12-24..2026-12-26 (repeatable)",
    )
    put.add_argument("--max-runs", type=int, metavar="N", help="fire N scheduled ticks in all")
    put.add_argument(
        "--delete-after",
        type=float,
        metavar="SECONDS",
        help="delete the job this long after it has no tick left (@at passed, end passed, "
        "max_runs used up)",
    )
    put.add_argument("--revision", type=_revision, metavar="N", help="compare-and-set")
    put.add_argument(
        "--atomic",
        action="store_true",
        help="with an array: write nothing if any job is refused",
    )
    _add_quiet(put)
    put.set_defaults(handler=_cmd_jobs_put)

    rm = verbs.add_parser("rm", help="delete a job")
    rm.add_argument("name", metavar="JOB", type=_job_name)
    rm.add_argument("--revision", type=_revision, metavar="N", help="compare-and-set")
    rm.set_defaults(handler=_cmd_jobs_rm)

    for verb, paused in (("pause", True), ("resume", False)):
        q = verbs.add_parser(verb, help=f"{verb} a job")
        q.add_argument("name", metavar="JOB", type=_job_name)
        q.set_defaults(handler=_cmd_jobs_pause, paused=paused)

    for parser in verbs.choices.values():
        _add_json(parser)
        add_connection_options(parser)


def _cmd_jobs_ls(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        with _progress(args, "reading jobs") as bar:
            entries = await admin.all_jobs(args.prefix, progress=_counting(bar))
        if args.json:
            _print_json(entries)
            return EXIT_OK
        rows = [
            [
                e.name,
                e.spec.schedule if e.spec else "-",
                e.spec.tz if e.spec else "-",
                ("paused" if e.spec.paused else "active") if e.spec else "INVALID",
                ",".join(e.spec.tags) if e.spec and e.spec.tags else "-",
                str(e.revision),
            ]
            for e in entries
        ]
        lines = _table(["JOB", "SCHEDULE", "TZ", "STATE", "TAGS", "REV"], rows)
        _emit([*lines, f"{len(entries)} job{'' if len(entries) == 1 else 's'}"])
        return EXIT_OK

    return run_admin(args, work)


def _cmd_jobs_get(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        entry = await admin.get_job(args.name)
        if args.json:
            _print_json(entry)
            return EXIT_OK
        lines = [f"revision: {entry.revision}"]
        if entry.spec is None:
            lines.append(f"INVALID: {entry.error}")
        else:
            for key, value in msgspec.structs.asdict(entry.spec).items():
                lines.append(f"{key}: {msgspec.json.encode(value).decode()}")
        _emit(lines)
        return EXIT_OK

    return run_admin(args, work)


def _counting(bar: Progress) -> Callable[[int, int], None]:
    def update(done: int, total: int) -> None:
        bar.set_total(total)
        bar.update(done)

    return update


def _spec_from_args(args: argparse.Namespace) -> JobSpec | list[JobSpec]:
    found = _read_spec_args(args)
    # Checked here as well as by the replica: a payload this deep cannot even be encoded
    # into the request.
    for spec in found if isinstance(found, list) else [found]:
        if json_depth(spec.payload) > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(_TOO_DEEP, "--file" if args.file else "--payload")
    return found


def _read_spec_args(args: argparse.Namespace) -> JobSpec | list[JobSpec]:
    flags = {
        "schedule": args.schedule,
        "tz": args.tz,
        "max_lateness": args.max_lateness,
        "jitter": args.jitter,
        "catchup": args.catchup,
        "overlap": args.overlap,
        "subject": args.subject,
        "description": args.description,
        "start": args.start,
        "end": args.end,
        "exclude": args.exclude,
        "max_runs": args.max_runs,
        "delete_after": args.delete_after,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if args.payload is not None:
        try:
            given["payload"] = msgspec.json.decode(args.payload)
        except msgspec.DecodeError as exc:
            raise InvalidInput(f"is not JSON: {exc}", "--payload") from None
        except RecursionError:
            raise InvalidInput(_TOO_DEEP, "--payload") from None
    if args.tags is not None:
        given["tags"] = [t.strip() for t in args.tags.split(",") if t.strip()]
    if args.paused:
        given["paused"] = True
    if args.file:
        if given:
            raise InvalidInput(
                f"cannot be combined with {', '.join('--' + k for k in given)}: put the "
                "fields in the file",
                "--file",
            )
        spec = _read_spec(args.file)
        if isinstance(spec, list):
            if args.name or args.revision is not None:
                where = "JOB" if args.name else "--revision"
                raise InvalidInput("goes with a single job spec, not an array of them", where)
            _check_unique(spec, args.file)
            return spec
        if args.name and args.name != spec.name:
            raise InvalidInput(f"{args.name!r} does not match the file's name {spec.name!r}", "JOB")
        return spec
    if not args.name or not args.schedule:
        raise InvalidInput("give JOB and --schedule, or -f FILE", "JOB")
    try:
        return msgspec.convert({"name": args.name, **given}, type=JobSpec)
    except msgspec.ValidationError as exc:
        raise InvalidInput(str(exc), "job") from None


def _read_spec(path: str) -> JobSpec | list[JobSpec]:
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", "--file") from None
    try:
        return msgspec.json.decode(data, type=JobSpec | list[JobSpec])
    except msgspec.MsgspecError as exc:
        raise InvalidInput(f"{path}: not a job spec or an array of them: {exc}", "--file") from None
    except RecursionError:
        raise InvalidInput(f"{path}: {_TOO_DEEP}", "--file") from None


def _check_unique(specs: Sequence[JobSpec], path: str) -> None:
    seen: set[str] = set()
    problems: list[Problem] = []
    for i, spec in enumerate(specs):
        if spec.name in seen:
            problems.append(Problem(f"{path}: [{i}].name", f"{spec.name!r} appears twice"))
        seen.add(spec.name)
    if problems:
        raise InvalidInput(problems)


def _cmd_jobs_put(args: argparse.Namespace) -> int:
    spec = _spec_from_args(args)
    if isinstance(spec, list):
        return _put_many(args, spec)

    async def work(admin: AdminClient) -> int:
        result = await admin.put_job(spec, args.revision)
        if args.json:
            _print_json(result)
        else:
            verb = "created" if result.created else "updated"
            _emit([f"{result.name}: {verb} (revision {result.revision})"])
        return EXIT_OK

    return run_admin(args, work)


def _put_many(args: argparse.Namespace, specs: list[JobSpec]) -> int:
    async def work(admin: AdminClient) -> int:
        puts: list[tuple[JobSpec, int | None]] = [(spec, None) for spec in specs]
        answers, written = await _write_with_progress(args, admin, puts, [])
        return _report(args, answers[: len(puts)], answers[len(puts) :], written=written)

    return run_admin(args, work)


async def _write_with_progress(
    args: argparse.Namespace,
    admin: AdminClient,
    puts: Sequence[tuple[JobSpec, int | None]],
    deletes: Sequence[tuple[str, int | None]],
) -> tuple[list[JobOutcome], bool]:
    """Writes and deletions through ``jobs.bulk`` with a progress bar; the answers (puts
    first) and whether anything was written. With ``--atomic`` every item is checked first
    (a dry run) and nothing is written if any is refused; with ``--dry-run`` only checked."""
    count = len(puts) + len(deletes)
    check_first = getattr(args, "atomic", False) or getattr(args, "dry_run", False)
    with _progress(args, "checking jobs" if check_first else "writing jobs", count) as bar:
        if check_first:
            checked = await admin.write_jobs(puts, deletes, dry_run=True, progress=bar.update)
            answers = [*checked[0], *checked[1]]
            if getattr(args, "dry_run", False):
                return answers, False
            if _refusals(answers):
                return _held_back(answers), False
            bar.stage("writing jobs", count)
        done = await admin.write_jobs(puts, deletes, atomic=check_first, progress=bar.update)
    return [*done[0], *done[1]], True


def _held_back(answers: Sequence[JobOutcome]) -> list[JobOutcome]:
    """The answers of a check with refusals, as the atomic write would have given them."""
    from hrwcron.admin.api import JobOutcome

    refused = {id(a) for a in _refusals(answers)}
    return [
        a if id(a) in refused else JobOutcome(name=a.name, outcome="skipped", revision=a.revision)
        for a in answers
    ]


_OUTCOME_VERBS = {"created": "created", "updated": "updated", "unchanged": "unchanged"}


def _refusals(answers: Sequence[JobOutcome]) -> list[JobOutcome]:
    return [a for a in answers if a.outcome in ("refused", "conflict", "failed")]


def _report(
    args: argparse.Namespace,
    puts: Sequence[JobOutcome],
    deletes: Sequence[JobOutcome],
    *,
    written: bool,
) -> int:
    """Print every answer of a bulk write (refusals on stderr) and return the exit code: 2 when
    a job was refused or in conflict, 1 when NATS did not confirm a write, else 0."""
    answers = [*puts, *deletes]
    if args.json:
        _print_json(answers)
    elif written:
        lines = [
            f"{a.name}: {a.outcome} (revision {a.revision})"
            for a in puts
            if a.outcome in _OUTCOME_VERBS
        ]
        lines += [f"{a.name}: deleted" for a in deletes if a.outcome == "deleted"]
        _emit(lines)
    _print_refusals(args, answers, written=written)
    return _exit_code(answers)


def _print_refusals(
    args: argparse.Namespace, answers: Sequence[JobOutcome], *, written: bool
) -> None:
    bad = _refusals(answers)
    for answer in bad:
        details = "; ".join(
            f"{p.field}: {p.message}" if p.field else p.message for p in answer.problems
        )
        print(
            f"hrwcron {args.command}: {answer.name}: {answer.outcome}: {details}", file=sys.stderr
        )
    if bad and not written:
        print(
            f"hrwcron {args.command}: {len(bad)} refused; nothing written (--atomic)",
            file=sys.stderr,
        )


def _exit_code(answers: Sequence[JobOutcome]) -> int:
    outcomes = {a.outcome for a in answers}
    if outcomes & {"refused", "conflict"}:
        return EXIT_REFUSED
    if "failed" in outcomes:
        return EXIT_SERVER
    return EXIT_OK


def _cmd_jobs_rm(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        result = await admin.delete_job(args.name, args.revision)
        if args.json:
            _print_json(result)
        else:
            _emit([f"{result.name}: deleted"])
        return EXIT_OK

    return run_admin(args, work)


def _cmd_jobs_pause(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        result = await admin.pause(args.name, args.paused)
        if args.json:
            _print_json(result)
        else:
            state = "paused" if result.paused else "active"
            note = "" if result.changed else " already"
            _emit([f"{result.name}:{note} {state} (revision {result.revision})"])
        return EXIT_OK

    return run_admin(args, work)


# --- trigger and backfill -----------------------------------------------------------------


def add_trigger(sub: Subparsers) -> None:
    p = sub.add_parser(
        "trigger",
        help="fire a job now, outside its schedule (admin API)",
        description=(
            "Publish a trigger for JOB now, through the same claim and fenced publish as a "
            "scheduled tick. Its tick key is JOB:manual:ID; the same --id never fires twice "
            "while the trigger stream keeps the job's triggers (looking it up there takes a "
            "few seconds for a job that fires every second)."
        ),
        epilog="example:\n  hrwcron trigger reports.daily --id rerun-2026-03-07",
        formatter_class=_FORMATTER,
    )
    p.add_argument("name", metavar="JOB", type=_job_name)
    p.add_argument("--id", default="", help="idempotency id (default: generated)")
    _add_json(p)
    add_connection_options(p)
    p.set_defaults(handler=_cmd_trigger)


def _cmd_trigger(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        wait = max(60.0, args.timeout) if args.id else None  # the id is looked up in the stream
        result = await admin.trigger(args.name, args.id, timeout=wait)
        if args.json:
            _print_json(result)
        elif result.outcome == "started":
            _emit([f"{result.tick}: published by {result.node} (due {_short(result.due)})"])
        else:
            _emit([f"{result.tick}: already fired before; nothing published"])
        return EXIT_OK

    return run_admin(args, work)


def add_backfill(sub: Subparsers) -> None:
    p = sub.add_parser(
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
        formatter_class=_FORMATTER,
    )
    p.add_argument("name", metavar="JOB", type=_job_name)
    p.add_argument("--from", dest="start", required=True, type=_iso, metavar="ISO8601")
    p.add_argument("--to", dest="end", required=True, type=_iso, metavar="ISO8601")
    p.add_argument("--dry-run", action="store_true", help="show what would be published")
    _add_json(p)
    add_connection_options(p)
    p.set_defaults(handler=_cmd_backfill)


def _cmd_backfill(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        result = await admin.backfill(
            args.name, args.start, args.end, dry_run=args.dry_run, timeout=max(120, args.timeout)
        )
        if args.json:
            _print_json(result)
            return EXIT_OK
        verb = "would publish" if result.dry_run else "published"
        lines = [f"  + {tick}" for tick in result.published]
        lines.append(
            f"{result.name}: {result.due} due instants; {verb} {len(result.published)}, "
            f"{len(result.present)} already fired, "
            f"{len(result.left_to_scheduler)} left to the scheduler"
        )
        _emit(lines)
        return EXIT_OK

    return run_admin(args, work)


# --- status and history -------------------------------------------------------------------


def add_status(sub: Subparsers) -> None:
    p = sub.add_parser(
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
        formatter_class=_FORMATTER,
    )
    p.add_argument("name", metavar="JOB", nargs="?", type=_job_name, help="one job only")
    p.add_argument("--prefix", default="", help="only jobs whose name starts with this")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--limit",
        type=_status_limit,
        metavar="N",
        help="show the N jobs due soonest (default: as many as fit the terminal, "
        f"{_screenful(24)} when it is not one)",
    )
    size.add_argument("--all", action="store_true", help="show every job, soonest due first")
    _add_json(p)
    _add_quiet(p)
    add_connection_options(p)
    p.set_defaults(handler=_cmd_status)


def _status_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("must be a whole number of at least 1")
    return value


def _screenful(lines: int) -> int:
    return max(MIN_STATUS_ROWS, lines - STATUS_CHROME)


async def _status_pages(args: argparse.Namespace, admin: AdminClient) -> StatusReply:
    """The first page's members and summary with the jobs of as many pages as asked for."""
    from hrwcron.admin.api import MAX_STATUS

    wanted = None if args.all else args.limit or _screenful(shutil.get_terminal_size().lines)
    first: StatusReply | None = None
    with _progress(args, "reading status") as bar:
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


def _cmd_status(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        reply = await _status_pages(args, admin)
        if args.json:
            _print_json(reply)
            return EXIT_OK
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
        lines += _table(
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
                _short(j.next_fire),
                j.last.tick if j.last else "-",
                ",".join(j.tags) or "-",
            ]
            for j in reply.jobs
        ]
        lines += _table(
            ["JOB", "SCHEDULE", "STATE", "OWNER", "FAILOVER", "NEXT", "LAST TRIGGER", "TAGS"],
            job_rows,
        )
        lines += [f"{j.name}: BAD: {j.problem}" for j in reply.jobs if j.problem]
        if reply.truncated:
            lines.append(
                f"showing the {len(reply.jobs):,} of {reply.total_jobs:,} jobs due soonest; "
                "--limit N for more, --all for every one"
            )
        _emit(lines)
        return EXIT_OK

    return run_admin(args, work)


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


def add_history(sub: Subparsers) -> None:
    p = sub.add_parser(
        "history",
        help="the last triggers of a job, read from the trigger stream (admin API)",
        formatter_class=_FORMATTER,
        epilog="example:\n  hrwcron history reports.daily -n 5",
    )
    p.add_argument("name", metavar="JOB", type=_job_name)
    p.add_argument(
        "-n", dest="limit", type=_history_count, default=20, metavar="N", help="default 20"
    )
    _add_json(p)
    add_connection_options(p)
    p.set_defaults(handler=_cmd_history)


def _history_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 1000")
    return value


def _cmd_history(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        reply = await admin.history(args.name, args.limit)
        if args.json:
            _print_json(reply)
            return EXIT_OK
        rows = [
            [
                str(t.seq),
                t.tick,
                t.kind,
                _short(t.due),
                _short(t.fired_at),
                t.node or "-",
                str(t.attempt),
            ]
            for t in reply.triggers
        ]
        lines = _table(["SEQ", "TICK", "KIND", "DUE", "FIRED", "NODE", "ATTEMPT"], rows)
        if not rows:
            lines = [f"{reply.name}: no triggers in the stream on {reply.subject}"]
        _emit(lines)
        return EXIT_OK

    return run_admin(args, work)


# --- apply --------------------------------------------------------------------------------


def add_apply(sub: Subparsers) -> None:
    p = sub.add_parser(
        "apply",
        help="make the jobs bucket match a file, showing the diff first (admin API)",
        description=(
            "Create or update every job in FILE (a TOML configuration file with [[jobs]], or "
            "a JSON array of job specs) through the admin API, printing the diff first. "
            "--prune also deletes jobs that are not in FILE; --dry-run prints the diff and "
            "has the replicas check every change without writing anything. Every write is "
            "compare-and-set against the revision the diff read, so an edit made meanwhile "
            "is reported as a conflict instead of being overwritten. Changes go in requests "
            "as large as the server allows, several in flight; each job is answered on its "
            "own, and a refused job (invalid, or its subject is another job's) is listed on "
            "stderr without stopping the others (exit 2). --atomic first has every change "
            "checked and writes nothing if any is refused; what it cannot cover is a "
            "concurrent writer changing a job between that check and its write, which is "
            "reported for that job as a conflict while the rest is written. Without "
            "--config or --nats-url the connection settings come from FILE (when it is TOML)."
        ),
        epilog="example:\n  hrwcron apply examples/hrwcron.toml --prune --dry-run",
        formatter_class=_FORMATTER,
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--prune", action="store_true", help="delete jobs that are not in FILE")
    p.add_argument(
        "--dry-run", action="store_true", help="print the diff and check it, write nothing"
    )
    p.add_argument("--atomic", action="store_true", help="write nothing if any change is refused")
    _add_json(p)
    _add_quiet(p)
    add_connection_options(p)
    p.set_defaults(handler=_cmd_apply)


def _jobs_from_file(path: str) -> list[JobSpec]:
    """The specs of FILE. A JSON array is checked for its shape and for names given twice
    here; the rules of each spec are the replicas' to check, with their own settings (subject
    prefix, payload limit), and a spec they refuse does not hold up the others."""
    if not path.endswith(".json"):
        return list(load_config(path, os.environ).jobs)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror}", path) from None
    try:
        specs = msgspec.json.decode(data, type=list[JobSpec])
    except msgspec.MsgspecError as exc:
        raise InvalidInput(f"not a JSON array of job specs: {exc}", path) from None
    except RecursionError:
        raise InvalidInput(_TOO_DEEP, path) from None
    for i, spec in enumerate(specs):
        if json_depth(spec.payload) > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(_TOO_DEEP, f"{path}: [{i}].payload")
    _check_unique(specs, path)
    return specs


def _cmd_apply(args: argparse.Namespace) -> int:
    from hrwcron.admin.client import ApiJobs
    from hrwcron.engine.jobsync import diff_jobs

    specs = _jobs_from_file(args.file)
    fallback = None if args.file.endswith(".json") else args.file
    config = connection_config(args, fallback=fallback)

    async def work(admin: AdminClient) -> int:
        with _progress(args, "reading jobs") as bar:
            store = ApiJobs(admin, progress=_counting(bar))
            now = int(time.time() * 1000)
            diff = await diff_jobs(store, specs, prune=args.prune, now_ms=now)
        if not args.json:
            _emit(diff.lines() or ["no changes"])
        puts = [(spec, 0) for spec in diff.create] + list(diff.update)
        answers: list[JobOutcome] = []
        written = False
        if not diff.empty:
            answers, written = await _write_with_progress(args, admin, puts, diff.delete)
        puts_answered, deletes_answered = answers[: len(puts)], answers[len(puts) :]
        if args.json:
            doc: dict[str, Any] = {
                "create": [s.name for s in diff.create],
                "update": [s.name for s, _ in diff.update],
                "delete": [n for n, _ in diff.delete],
                "unchanged": diff.unchanged,
                "expired": [name for name, _ in diff.expired],
                "dry_run": args.dry_run,
            }
            refused = _refusals(answers)
            if refused:
                doc["refused"] = refused
            _print_json(doc)
        _print_refusals(args, answers, written=written or args.dry_run)
        if written and not args.json:
            _emit([_applied_line(puts_answered, deletes_answered)])
        return _exit_code(answers)

    return run_admin(args, work, config=config)


def _applied_line(puts: Sequence[JobOutcome], deletes: Sequence[JobOutcome]) -> str:
    counts = {o: 0 for o in ("created", "updated", "deleted")}
    for answer in (*puts, *deletes):
        if answer.outcome in counts:
            counts[answer.outcome] += 1
    line = (
        f"applied: {counts['created']} created, {counts['updated']} updated, "
        f"{counts['deleted']} deleted"
    )
    left = len(_refusals([*puts, *deletes]))
    return line + (f"; {left} not applied (listed on stderr)" if left else "")


# --- `hrwcron next JOB` -------------------------------------------------------------------


def job_schedule(args: argparse.Namespace) -> tuple[JobSpec, int | None]:
    """The spec of the job ``args.expr`` names, and its runs left when it has max_runs,
    read through the API."""
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
        raise _ServerFailure(code)
    return found[0]


class _ServerFailure(HrwcronError):
    """The lookup failed and was reported already; carries the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


def next_for_job(args: argparse.Namespace, emit: Callable[[JobSpec, int | None], int]) -> int:
    """Runs ``emit(spec, runs_left)`` for the job named by ``args.expr``; returns an exit
    code."""
    if args.tz is not None:
        raise InvalidInput("a job's schedule uses the job's own time zone; drop --tz", "--tz")
    try:
        spec, left = job_schedule(args)
    except _ServerFailure as exc:
        return exc.code
    return emit(spec, left)
