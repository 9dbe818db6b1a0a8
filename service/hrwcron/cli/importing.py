"""``hrwcron import crontab`` and ``hrwcron import kubernetes``: schedules from a crontab or
CronJob manifests as the JSON array of job specs ``hrwcron apply`` takes, or written with
``--apply`` through the same diff and checks as ``apply``.

The reading is :mod:`hrwcron.importers`; this module reads the files, prints the notes on
stderr and either the specs or, when any entry cannot be expressed, every problem (exit 2,
nothing on stdout, nothing written).
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from hrwcron.cli.bulk import apply_specs
from hrwcron.cli.options import CONNECTION, JSON, QUIET, job_name
from hrwcron.cli.output import print_json
from hrwcron.cli.request import EXIT_OK, connection_config
from hrwcron.cli.verb import Group, Verb, arg
from hrwcron.core.errors import InvalidInput
from hrwcron.core.model import tz_problem
from hrwcron.importers import (
    MAX_SOURCE_BYTES,
    CrontabOptions,
    KubernetesOptions,
    Report,
    read_crontab,
    read_manifests,
)


def _paragraphs(*texts: str) -> str:
    # Kept as paragraphs under the raw formatter, which also keeps the examples' lines.
    return "\n\n".join(textwrap.fill(text, 79) for text in texts)


def _zone(text: str) -> str:
    problem = tz_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _read(path: str) -> tuple[str, bytes]:
    """FILE's name for messages and its bytes ("-": standard input); one byte more than an
    import takes is as far as a larger file is read."""
    try:
        if path == "-":
            return "stdin", sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
        with open(path, "rb") as fh:
            return path, fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror}", path) from None


def _check_flags(args: argparse.Namespace) -> None:
    if not args.apply:
        for flag in ("dry_run", "atomic"):
            if getattr(args, flag):
                option = "--" + flag.replace("_", "-")
                raise InvalidInput(f"goes with --apply ({option} checks a write)", option)


def _finish(args: argparse.Namespace, report: Report) -> int:
    for note in report.notes:
        print(f"hrwcron import: note: {note}", file=sys.stderr)
    specs = report.specs_or_raise()
    if not args.apply:
        print_json(specs)
        return EXIT_OK
    return apply_specs(args, specs, connection_config(args))


def _cmd_crontab(args: argparse.Namespace) -> int:
    _check_flags(args)
    source, data = _read(args.file)
    options = CrontabOptions(system=args.system, user=args.user, tz=args.tz, prefix=args.prefix)
    return _finish(args, read_crontab(data, source, options))


def _cmd_kubernetes(args: argparse.Namespace) -> int:
    _check_flags(args)
    files = [_read(path) for path in args.files]
    options = KubernetesOptions(tz=args.tz, labels_as_tags=args.labels_as_tags, prefix=args.prefix)
    return _finish(args, read_manifests(files, options))


_WRITE = Group(
    title="writing (with --apply)",
    args=(
        arg(
            "--apply",
            action="store_true",
            help="write the jobs through the admin API, showing the diff first, as apply does",
        ),
        arg("--dry-run", action="store_true", help="print the diff and check it, write nothing"),
        arg("--atomic", action="store_true", help="write nothing if any change is refused"),
        JSON,
        QUIET,
    ),
)
_PREFIX = arg(
    "--prefix",
    type=job_name,
    metavar="NAME",
    help="put NAME. before every job name (to keep one source's jobs apart from others)",
)

CRONTAB = Verb(
    "crontab",
    help="turn a cronie crontab into job specs",
    description=_paragraphs(
        "Read FILE ('-': standard input) as cronie reads a crontab and print its entries as a "
        "JSON array of job specs for 'hrwcron apply FILE.json', or write them with --apply. "
        "A user crontab by default; --system reads /etc/crontab's form, with a user column "
        "after the five fields (it is not guessed: a user name and a command's first word "
        "look alike).",
        "Each job's payload holds the command, its standard input (cronie's '%': the first "
        "unescaped % ends the command, each further % is a newline, \\% a %), the user and "
        "the variables set above the entry (env). CRON_TZ= sets the zone of the entries "
        "below it, --tz the zone of the host for the others; TZ= reaches only the commands' "
        "environment, as in cronie. RANDOM_DELAY= becomes jitter. cronie has no line "
        "continuations: a trailing backslash stays in the command. The job is named by a "
        "'# name: NAME' comment directly above the entry, else after its command (made "
        "unique with -2, -3, ... in file order); the other comments directly above a named "
        "entry become its description.",
        "Daylight saving: cronie keeps hrwcron's rule in the host's zone, but in a CRON_TZ "
        "zone it skips a fixed-time entry whose time a spring-forward jumps over and runs it "
        "twice in a repeated hour; the imported job runs once in both cases (as the gap ends, "
        "on the first pass).",
        "What cannot be expressed (@reboot, a field cronie refuses, a schedule that never "
        "fires, a command or standard input that is not plain text, a last line without a "
        "newline, which cronie ignores) is reported with its line number, all at once, and "
        "then nothing is printed or written (exit 2).",
    ),
    epilog=(
        "examples:\n"
        "  crontab -l | hrwcron import crontab - --user alice --tz Europe/Berlin > jobs.json\n"
        "  hrwcron import crontab /etc/crontab --system --prefix web1 --apply --dry-run"
    ),
    args=(
        arg("file", metavar="FILE"),
        Group(
            exclusive=True,
            args=(
                arg(
                    "--system",
                    action="store_true",
                    help="/etc/crontab form: a user column after the schedule",
                ),
                arg("--user", metavar="NAME", help="the owner of a user crontab, for the payload"),
            ),
        ),
        arg(
            "--tz",
            type=_zone,
            default="UTC",
            metavar="ZONE",
            help="the zone of the host the crontab ran on (default: UTC)",
        ),
        _PREFIX,
        _WRITE,
        CONNECTION,
    ),
    run=_cmd_crontab,
)

KUBERNETES = Verb(
    "kubernetes",
    help="turn Kubernetes CronJob manifests into job specs",
    description=_paragraphs(
        "Read the CronJobs (batch/v1) in each FILE ('-': standard input): multi-document "
        "YAML, or a List such as 'kubectl get cronjobs -A -o yaml' prints. Each becomes the "
        "job <namespace>.<name>: spec.schedule read as the CronJob controller reads it, "
        "spec.timeZone (else --tz, the controller's zone), suspend as paused, "
        "concurrencyPolicy Forbid as overlap 'skip', startingDeadlineSeconds as max_lateness, "
        "catchup 'latest' (the controller starts only the newest missed run), and the job "
        "template, namespace and CronJob name in the payload. --labels-as-tags makes each "
        "label k=v a tag (with / written :); tags decide which replicas may run a job. Other "
        "objects are skipped with a note.",
        "Daylight saving: the controller skips a fixed-time schedule whose time a "
        "spring-forward jumps over and starts it twice in a repeated hour; the imported job "
        "runs once in both cases (as the gap ends, on the first pass).",
        "What cannot be expressed (concurrencyPolicy Replace, TZ= or CRON_TZ= in the "
        "schedule, which Kubernetes refuses, @every, a field the controller refuses) is "
        "reported with its file and line, all at once, and then nothing is printed or "
        "written (exit 2).",
    ),
    epilog=(
        "examples:\n"
        "  kubectl get cronjobs -A -o yaml | hrwcron import kubernetes - > jobs.json\n"
        "  hrwcron import kubernetes deploy/*.yaml --labels-as-tags --apply --dry-run"
    ),
    args=(
        arg("files", metavar="FILE", nargs="+"),
        arg(
            "--tz",
            type=_zone,
            default="UTC",
            metavar="ZONE",
            help="the zone of CronJobs without spec.timeZone (default: UTC)",
        ),
        arg("--labels-as-tags", action="store_true", help="each label k=v becomes a tag"),
        _PREFIX,
        _WRITE,
        CONNECTION,
    ),
    run=_cmd_kubernetes,
)

IMPORT = Verb(
    "import",
    help="turn a crontab or Kubernetes CronJobs into job specs, or apply them",
    verbs=(CRONTAB, KUBERNETES),
)
