"""Many job writes through ``jobs.bulk``, shared by ``jobs put`` with an array, ``apply`` and
``import --apply``: the diff against the bucket, writing with a progress bar, ``--atomic`` and
``--dry-run`` checks, and reporting each job's answer with the exit code they add up to."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hrwcron.cli.output import emit, print_json
from hrwcron.cli.request import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_SERVER,
    counting,
    progress,
    run_admin,
)
from hrwcron.core.config import Config
from hrwcron.core.errors import InvalidInput, Problem
from hrwcron.core.model import MAX_PAYLOAD_DEPTH, JobSpec

if TYPE_CHECKING:
    from hrwcron.admin.api import JobOutcome
    from hrwcron.admin.client import AdminClient

TOO_DEEP = f"nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep"


def check_unique(specs: Sequence[JobSpec], path: str) -> None:
    seen: set[str] = set()
    problems: list[Problem] = []
    for i, spec in enumerate(specs):
        if spec.name in seen:
            problems.append(Problem(f"{path}: [{i}].name", f"{spec.name!r} appears twice"))
        seen.add(spec.name)
    if problems:
        raise InvalidInput(problems)


def apply_specs(args: argparse.Namespace, specs: Sequence[JobSpec], config: Config) -> int:
    """Make the jobs bucket hold ``specs``: print the diff (``+ ~ - =``), then write it through
    ``jobs.bulk`` as ``--dry-run``, ``--atomic`` and ``--prune`` (when the verb has them) say,
    and report each job's answer; ``--json`` prints the diff's names and the refusals."""
    from hrwcron.admin.client import ApiJobs
    from hrwcron.engine.jobsync import diff_jobs

    prune = getattr(args, "prune", False)
    dry_run = getattr(args, "dry_run", False)

    async def work(admin: AdminClient) -> int:
        with progress(args, "reading jobs") as bar:
            store = ApiJobs(admin, progress=counting(bar))
            now = int(time.time() * 1000)
            diff = await diff_jobs(store, specs, prune=prune, now_ms=now)
        if not args.json:
            emit(diff.lines() or ["no changes"])
        puts = [(spec, 0) for spec in diff.create] + list(diff.update)
        answers: list[JobOutcome] = []
        written = False
        if not diff.empty:
            answers, written = await write_with_progress(args, admin, puts, diff.delete)
        puts_answered, deletes_answered = answers[: len(puts)], answers[len(puts) :]
        if args.json:
            doc: dict[str, Any] = {
                "create": [s.name for s in diff.create],
                "update": [s.name for s, _ in diff.update],
                "delete": [n for n, _ in diff.delete],
                "unchanged": diff.unchanged,
                "expired": [name for name, _ in diff.expired],
                "dry_run": dry_run,
            }
            refused = refusals(answers)
            if refused:
                doc["refused"] = refused
            print_json(doc)
        print_refusals(args, answers, written=written or dry_run)
        if written and not args.json:
            emit([_applied_line(puts_answered, deletes_answered)])
        return exit_code(answers)

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
    left = len(refusals([*puts, *deletes]))
    return line + (f"; {left} not applied (listed on stderr)" if left else "")


async def write_with_progress(
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
    with progress(args, "checking jobs" if check_first else "writing jobs", count) as bar:
        if check_first:
            checked = await admin.write_jobs(puts, deletes, dry_run=True, progress=bar.update)
            answers = [*checked[0], *checked[1]]
            if getattr(args, "dry_run", False):
                return answers, False
            if refusals(answers):
                return _held_back(answers), False
            bar.stage("writing jobs", count)
        done = await admin.write_jobs(puts, deletes, atomic=check_first, progress=bar.update)
    return [*done[0], *done[1]], True


def _held_back(answers: Sequence[JobOutcome]) -> list[JobOutcome]:
    """The answers of a check with refusals, as the atomic write would have given them."""
    from hrwcron.admin.api import JobOutcome

    refused = {id(a) for a in refusals(answers)}
    return [
        a if id(a) in refused else JobOutcome(name=a.name, outcome="skipped", revision=a.revision)
        for a in answers
    ]


_OUTCOME_VERBS = {"created": "created", "updated": "updated", "unchanged": "unchanged"}


def refusals(answers: Sequence[JobOutcome]) -> list[JobOutcome]:
    return [a for a in answers if a.outcome in ("refused", "conflict", "failed")]


def report(
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
        print_json(answers)
    elif written:
        lines = [
            f"{a.name}: {a.outcome} (revision {a.revision})"
            for a in puts
            if a.outcome in _OUTCOME_VERBS
        ]
        lines += [f"{a.name}: deleted" for a in deletes if a.outcome == "deleted"]
        emit(lines)
    print_refusals(args, answers, written=written)
    return exit_code(answers)


def print_refusals(
    args: argparse.Namespace, answers: Sequence[JobOutcome], *, written: bool
) -> None:
    bad = refusals(answers)
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


def exit_code(answers: Sequence[JobOutcome]) -> int:
    outcomes = {a.outcome for a in answers}
    if outcomes & {"refused", "conflict"}:
        return EXIT_REFUSED
    if "failed" in outcomes:
        return EXIT_SERVER
    return EXIT_OK
