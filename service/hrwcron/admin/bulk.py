"""The bulk write of many jobs: each item checked, answered, and what is left to write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError

from hrwcron.admin.api import (
    BulkDelete,
    BulkOutcome,
    BulkPut,
    BulkResult,
    JobOutcome,
    ProblemBody,
    RequestProblem,
    decode_request,
)
from hrwcron.admin.replies import subject_taken
from hrwcron.core import partitions
from hrwcron.core.errors import (
    ConflictError,
    Problem,
    SubjectTakenError,
)
from hrwcron.core.model import JobSpec, encode, job_name_problem
from hrwcron.engine.ports import (
    JobEvent,
    JobsEditor,
    StoreRefused,
    StoreUnavailable,
)
from hrwcron.engine.queries import EngineQueries

log = logging.getLogger("hrwcron.admin")

# Jobs of a bulk request read from the bucket at a time (those other replicas hold).
READS_IN_FLIGHT = 256


class BulkPlan:
    """The answers to one bulk request as its items are checked, and what is left to write."""

    def __init__(
        self, scheduler: EngineQueries, elsewhere: dict[str, JobEvent] | None = None
    ) -> None:
        """``elsewhere``: the stored jobs of this request that other replicas hold, as read
        from the bucket (a replica holding a share knows only its own)."""
        self._scheduler = scheduler
        self._elsewhere = elsewhere or {}
        self._prefix = scheduler.settings.subject_prefix
        self.puts: list[JobOutcome] = []
        self.deletes: list[JobOutcome] = []
        self.to_write: list[tuple[int, JobSpec, int | None]] = []
        self.to_delete: list[tuple[int, str, int | None]] = []
        self.refusals = 0
        self._names: set[str] = set()
        self._subjects: dict[str, str] = {}

    def _stored_spec(self, name: str) -> JobSpec | None:
        job = self._scheduler.jobs.get(name)
        if job is not None:
            return job.spec
        stored = self._elsewhere.get(name)
        return stored.spec if stored is not None else None

    def _stored_revision(self, name: str) -> int:
        job = self._scheduler.jobs.get(name)
        if job is not None:
            return job.revision
        stored = self._elsewhere.get(name)
        if stored is not None:
            return stored.revision
        skipped = self._scheduler.skipped.get(name)
        return skipped[0] if skipped is not None else 0

    def _refuse(self, name: str, outcome: BulkOutcome, problems: list[Problem]) -> JobOutcome:
        self.refusals += 1
        return JobOutcome(
            name=name,
            outcome=outcome,
            problems=[ProblemBody(field=p.where, message=p.message) for p in problems],
        )

    def add_put(
        self, index: int, raw: msgspec.Raw, spec_problems: Callable[[JobSpec], list[Problem]]
    ) -> None:
        try:
            item = decode_request(raw, BulkPut)
        except RequestProblem as exc:
            problem = Problem(
                f"jobs[{index}].{exc.field}" if exc.field else f"jobs[{index}]", exc.message
            )
            self.puts.append(self._refuse(name_in(raw), "refused", [problem]))
            return
        spec = item.spec
        problems = spec_problems(spec)
        subject = spec.trigger_subject(self._prefix)
        if spec.name in self._names:
            problems.append(Problem("spec.name", "appears more than once in this request"))
        elif subject in self._subjects:
            other = self._subjects[subject]
            problems.append(
                Problem("spec.subject", f"{subject!r} is also the subject of {other!r} here")
            )
        holder = self._scheduler.job_on_subject(subject)
        if holder is not None and holder != spec.name:
            problems.append(Problem("spec.subject", subject_taken(subject, holder)))
        self._names.add(spec.name)
        if problems:
            self.puts.append(self._refuse(spec.name, "refused", problems))
            return
        self._subjects[subject] = spec.name  # only an accepted job holds it in the request
        current = self._stored_spec(spec.name)
        stored = self._stored_revision(spec.name)
        if current is not None and encode(current) == encode(spec):
            self.puts.append(JobOutcome(name=spec.name, outcome="unchanged", revision=stored))
            return
        conflict = revision_conflict(spec.name, item.revision, stored)
        if conflict:
            self.puts.append(self._refuse(spec.name, "conflict", [Problem("revision", conflict)]))
            return
        self.to_write.append((index, spec, item.revision))
        self.puts.append(JobOutcome(name=spec.name, outcome="updated" if stored else "created"))

    def add_delete(self, index: int, raw: msgspec.Raw) -> None:
        where = f"delete[{index}]"
        try:
            item = decode_request(raw, BulkDelete)
        except RequestProblem as exc:
            problem = Problem(f"{where}.{exc.field}" if exc.field else where, exc.message)
            self.deletes.append(self._refuse(name_in(raw), "refused", [problem]))
            return
        bad = job_name_problem(item.name)
        if bad:
            self.deletes.append(self._refuse(item.name, "refused", [Problem("name", bad)]))
            return
        if item.name in self._names:
            problem = Problem("name", "is both written and deleted in this request")
            self.deletes.append(self._refuse(item.name, "refused", [problem]))
            return
        self._names.add(item.name)
        stored = self._stored_revision(item.name)
        if not stored:
            self.deletes.append(JobOutcome(name=item.name, outcome="absent"))
            return
        if item.revision is not None and item.revision != stored:
            conflict = revision_conflict(item.name, item.revision, stored) or ""
            self.deletes.append(
                self._refuse(item.name, "conflict", [Problem("revision", conflict)])
            )
            return
        self.to_delete.append((index, item.name, stored))
        self.deletes.append(JobOutcome(name=item.name, outcome="deleted", revision=stored))

    def hold_back(self) -> None:
        """Atomic and something was refused: nothing is written."""
        note = [
            ProblemBody(
                field="",
                message=f"not written: the request is atomic and {self.refusals} of its "
                "items were refused",
            )
        ]
        for index, spec, _ in self.to_write:
            self.puts[index] = JobOutcome(name=spec.name, outcome="skipped", problems=note)
        for index, name, _ in self.to_delete:
            self.deletes[index] = JobOutcome(name=name, outcome="skipped", problems=note)
        self.to_write, self.to_delete = [], []

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for outcome in (*self.puts, *self.deletes):
            found[outcome.outcome] = found.get(outcome.outcome, 0) + 1
        return found


def revision_conflict(name: str, asked: int | None, stored: int) -> str | None:
    if asked is None or asked == stored:
        return None
    if asked == 0:
        return f"job {name!r} already exists (revision {stored}); pass that revision to replace it"
    if not stored:
        return f"job {name!r} does not exist (any more); revision {asked} was asked for"
    return (
        f"job {name!r} changed since revision {asked} (it is at revision {stored} now): "
        "read it again and retry"
    )


def failed_write(name: str, error: Exception, subject_field: str) -> JobOutcome:
    if isinstance(error, SubjectTakenError):
        problem = ProblemBody(field=subject_field, message=str(error))
        return JobOutcome(name=name, outcome="refused", problems=[problem])
    if isinstance(error, ConflictError):
        problem = ProblemBody(field="revision", message=str(error))
        return JobOutcome(name=name, outcome="conflict", problems=[problem])
    if not isinstance(
        error, StoreUnavailable | StoreRefused | TimeoutError | NatsTimeoutError | APIError
    ):
        log.error("bulk write of %s failed: %s: %s", name, type(error).__name__, error)
    problem = ProblemBody(field="", message=f"NATS did not confirm the write ({error!r}); retry")
    return JobOutcome(name=name, outcome="failed", problems=[problem])


async def read_elsewhere(
    scheduler: EngineQueries, jobs: JobsEditor, raws: list[msgspec.Raw], names: list[str]
) -> dict[str, JobEvent]:
    """The stored jobs a bulk request names that this replica does not hold (holding a
    share), read from the bucket a bounded number at a time."""
    held = scheduler.held_lanes
    if held is None:
        return {}
    # A create (revision 0) needs nothing read: its create-only write fails if the job exists.
    wanted = {
        name
        for name in [*(_name_unless_created(raw) for raw in raws), *names]
        if name
        and name not in scheduler.jobs
        and partitions.lane_of(name, ()) not in held
        and job_name_problem(name) is None
    }
    slots = asyncio.Semaphore(READS_IN_FLIGHT)

    async def read(name: str) -> tuple[str, JobEvent | None]:
        async with slots:
            return name, await jobs.get(name)

    found = await asyncio.gather(*(read(name) for name in sorted(wanted)))
    return {name: event for name, event in found if event is not None}


def _decoded(raw: msgspec.Raw) -> dict[str, Any] | None:
    try:
        return msgspec.json.decode(raw, type=dict[str, Any])
    except (msgspec.MsgspecError, RecursionError):
        return None


def _name_of(item: dict[str, Any] | None) -> str:
    if item is None:
        return ""
    spec = item.get("spec")
    name = spec.get("name") if isinstance(spec, dict) else item.get("name")
    return name[:600] if isinstance(name, str) else ""


def _name_unless_created(raw: msgspec.Raw) -> str:
    """The job an item names, empty for a create (revision 0), decoded once."""
    item = _decoded(raw)
    return "" if item is not None and item.get("revision") == 0 else _name_of(item)


def name_in(raw: msgspec.Raw) -> str:
    """The job name an undecodable item gives, for its answer (empty when it gives none)."""
    return _name_of(_decoded(raw))


def fit_bulk(result: BulkResult, limit: int) -> BulkResult:
    """The result, with problem texts shortened (then dropped) until it fits one reply."""
    for keep, length in ((None, None), (3, 300), (1, 100), (0, 0)):
        if len(msgspec.json.encode(result)) <= limit:
            return result
        for outcome in (*result.jobs, *result.deleted):
            if outcome.problems and keep is not None and length is not None:
                dropped = len(outcome.problems) - keep
                kept = [
                    ProblemBody(field=p.field[:100], message=p.message[:length])
                    for p in outcome.problems[:keep]
                ]
                if dropped > 0 and keep:
                    kept.append(ProblemBody(field="", message=f"... and {dropped} more"))
                outcome.problems = kept
    return result
