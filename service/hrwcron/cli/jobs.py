"""The ``jobs`` verbs: list, show, write, delete, pause and resume jobs (admin API)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import msgspec

from hrwcron.cli.bulk import TOO_DEEP, check_unique, report, write_with_progress
from hrwcron.cli.options import CONNECTION, JOB, JSON, PREFIX, QUIET, job_name, revision
from hrwcron.cli.output import plural, table
from hrwcron.cli.request import ask, counting, progress, run_admin
from hrwcron.cli.verb import Verb, arg
from hrwcron.core.errors import InvalidInput
from hrwcron.core.model import MAX_PAYLOAD_DEPTH, JobSpec, json_depth

if TYPE_CHECKING:
    from hrwcron.admin.api import DeleteResult, JobEntry, PauseResult, PutResult
    from hrwcron.admin.client import AdminClient


async def _list(args: argparse.Namespace, admin: AdminClient) -> list[JobEntry]:
    with progress(args, "reading jobs") as bar:
        return await admin.all_jobs(args.prefix, progress=counting(bar))


def _show_list(args: argparse.Namespace, entries: list[JobEntry]) -> list[str]:
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
    lines = table(["JOB", "SCHEDULE", "TZ", "STATE", "TAGS", "REV"], rows)
    return [*lines, plural(len(entries), "job")]


async def _get(args: argparse.Namespace, admin: AdminClient) -> JobEntry:
    return await admin.get_job(args.name)


def _show_entry(args: argparse.Namespace, entry: JobEntry) -> list[str]:
    lines = [f"revision: {entry.revision}"]
    if entry.spec is None:
        lines.append(f"INVALID: {entry.error}")
    else:
        for key, value in msgspec.structs.asdict(entry.spec).items():
            lines.append(f"{key}: {msgspec.json.encode(value).decode()}")
    return lines


# --- put ----------------------------------------------------------------------------------


def _cmd_put(args: argparse.Namespace) -> int:
    spec = _spec_from_args(args)
    if isinstance(spec, list):
        return _put_many(args, spec)

    async def put(args: argparse.Namespace, admin: AdminClient) -> PutResult:
        return await admin.put_job(spec, args.revision)

    return ask(args, put, _show_put)


def _show_put(args: argparse.Namespace, result: PutResult) -> list[str]:
    verb = "created" if result.created else "updated"
    return [f"{result.name}: {verb} (revision {result.revision})"]


def _put_many(args: argparse.Namespace, specs: list[JobSpec]) -> int:
    async def work(admin: AdminClient) -> int:
        puts: list[tuple[JobSpec, int | None]] = [(spec, None) for spec in specs]
        answers, written = await write_with_progress(args, admin, puts, [])
        return report(args, answers[: len(puts)], answers[len(puts) :], written=written)

    return run_admin(args, work)


def _spec_from_args(args: argparse.Namespace) -> JobSpec | list[JobSpec]:
    found = _read_spec_args(args)
    # Checked here as well as by the replica: a payload this deep cannot even be encoded
    # into the request.
    for spec in found if isinstance(found, list) else [found]:
        if json_depth(spec.payload) > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(TOO_DEEP, "--file" if args.file else "--payload")
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
            raise InvalidInput(TOO_DEEP, "--payload") from None
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
            check_unique(spec, args.file)
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
        raise InvalidInput(f"{path}: {TOO_DEEP}", "--file") from None


# --- rm, pause, resume --------------------------------------------------------------------


async def _delete(args: argparse.Namespace, admin: AdminClient) -> DeleteResult:
    return await admin.delete_job(args.name, args.revision)


def _show_delete(args: argparse.Namespace, result: DeleteResult) -> list[str]:
    return [f"{result.name}: deleted"]


async def _pause(args: argparse.Namespace, admin: AdminClient) -> PauseResult:
    return await admin.pause(args.name, args.paused)


def _show_pause(args: argparse.Namespace, result: PauseResult) -> list[str]:
    state = "paused" if result.paused else "active"
    note = "" if result.changed else " already"
    return [f"{result.name}:{note} {state} (revision {result.revision})"]


_COMPARE_AND_SET = arg("--revision", type=revision, metavar="N", help="compare-and-set")
_PUT_ARGS = (
    arg("name", metavar="JOB", nargs="?", type=job_name),
    arg("-f", "--file", metavar="FILE", help="JSON job spec ('-' for stdin)"),
    arg("--schedule", metavar="EXPR", help="cron expression or '@every 5m'"),
    arg("--tz", metavar="ZONE", help="IANA time zone (default UTC)"),
    arg("--payload", metavar="JSON", help="static payload, any JSON value"),
    arg("--max-lateness", type=float, metavar="SECONDS"),
    arg("--jitter", type=float, metavar="SECONDS"),
    arg("--catchup", choices=("all", "latest")),
    arg("--overlap", choices=("allow", "skip")),
    arg("--tags", metavar="A,B", help="members must carry all of these tags"),
    arg("--subject", metavar="SUBJECT", help="trigger subject (default per job)"),
    arg("--description", metavar="TEXT"),
    arg("--paused", action="store_true", help="write the job paused"),
    arg("--start", metavar="RFC3339", help="no tick before this instant"),
    arg("--end", metavar="RFC3339", help="no tick after this instant"),
    arg(
        "--exclude",
        action="append",
        metavar="RULE",
        help="skip ticks on these local times: a cron expression or a date range such as "
        "2026-12-24..2026-12-26 (repeatable)",
    ),
    arg("--max-runs", type=int, metavar="N", help="fire N scheduled ticks in all"),
    arg(
        "--delete-after",
        type=float,
        metavar="SECONDS",
        help="delete the job this long after it has no tick left (@at passed, end passed, "
        "max_runs used up)",
    ),
    _COMPARE_AND_SET,
    arg("--atomic", action="store_true", help="with an array: write nothing if any job is refused"),
    QUIET,
    JSON,
    CONNECTION,
)

JOBS = Verb(
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
    verbs=(
        Verb(
            "ls",
            help="list jobs",
            args=(PREFIX, QUIET, JSON, CONNECTION),
            request=_list,
            show=_show_list,
        ),
        Verb(
            "get",
            help="show one job and its revision",
            args=(JOB, JSON, CONNECTION),
            request=_get,
            show=_show_entry,
        ),
        Verb(
            "put",
            help="create or replace a job",
            description=(
                "Create or replace a job from flags or from a JSON file (-f FILE, '-' for stdin) "
                "holding one job spec. With --revision N the write only happens if the job is "
                "still at revision N (0: only if it does not exist). A file holding a JSON array "
                "of job specs writes them all, in requests as large as the server allows with "
                "several in flight; each job is answered on its own (created, updated, "
                "unchanged, or refused with its problems) and a refused one does not stop the "
                "others. --atomic first has every job checked and writes nothing if any is "
                "refused; a job that a concurrent writer changes between that check and its "
                "write is still reported on its own, as a conflict."
            ),
            args=_PUT_ARGS,
            run=_cmd_put,
            raw=False,
        ),
        Verb(
            "rm",
            help="delete a job",
            args=(JOB, _COMPARE_AND_SET, JSON, CONNECTION),
            request=_delete,
            show=_show_delete,
        ),
        *(
            Verb(
                verb,
                help=f"{verb} a job",
                args=(JOB, JSON, CONNECTION),
                request=_pause,
                show=_show_pause,
                defaults={"paused": paused},
            )
            for verb, paused in (("pause", True), ("resume", False))
        ),
    ),
)
