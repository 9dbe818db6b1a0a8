"""``hrwcron apply``: make the jobs bucket match a file, showing the diff first (admin API)."""

from __future__ import annotations

import argparse
import os

import msgspec

from hrwcron.cli.bulk import TOO_DEEP, apply_specs, check_unique
from hrwcron.cli.options import CONNECTION, JSON, QUIET
from hrwcron.cli.request import connection_config
from hrwcron.cli.verb import Verb, arg
from hrwcron.core.config import load_config
from hrwcron.core.errors import InvalidInput
from hrwcron.core.model import MAX_PAYLOAD_DEPTH, JobSpec, json_depth


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
        raise InvalidInput(TOO_DEEP, path) from None
    for i, spec in enumerate(specs):
        if json_depth(spec.payload) > MAX_PAYLOAD_DEPTH:
            raise InvalidInput(TOO_DEEP, f"{path}: [{i}].payload")
    check_unique(specs, path)
    return specs


def _cmd_apply(args: argparse.Namespace) -> int:
    specs = _jobs_from_file(args.file)
    fallback = None if args.file.endswith(".json") else args.file
    return apply_specs(args, specs, connection_config(args, fallback=fallback))


APPLY = Verb(
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
    args=(
        arg("file", metavar="FILE"),
        arg("--prune", action="store_true", help="delete jobs that are not in FILE"),
        arg("--dry-run", action="store_true", help="print the diff and check it, write nothing"),
        arg("--atomic", action="store_true", help="write nothing if any change is refused"),
        JSON,
        QUIET,
        CONNECTION,
    ),
    run=_cmd_apply,
)
