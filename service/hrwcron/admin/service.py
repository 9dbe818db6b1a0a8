"""The admin API as a NATS micro service, served by every replica in one queue group.

Every request is validated completely before anything is written: a refused request changes
nothing. Writes to the jobs bucket go through the same port the replicas watch, so a change is
live on every replica as soon as the watch delivers it. Firing by hand and backfilling go
through the engine's claim and fenced publish, never around it.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, ServiceUnavailableError
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from hrwcron import __version__
from hrwcron.admin.api import (
    ADMIN_PREFIX,
    ERROR_CODES,
    MAX_BACKFILL,
    QUEUE_GROUP,
    REQUEST_TYPES,
    SERVICE_NAME,
    BackfillJob,
    BackfillResult,
    BulkDelete,
    BulkOutcome,
    BulkPut,
    BulkResult,
    DeleteJob,
    DeleteResult,
    ErrorBody,
    ErrorReply,
    GetJob,
    HistoryEntry,
    HistoryReply,
    HistoryRequest,
    JobEntry,
    JobList,
    JobOutcome,
    JobStatus,
    LastTriggerStatus,
    ListJobs,
    MemberStatus,
    PauseJob,
    PauseResult,
    ProblemBody,
    PutJob,
    PutJobs,
    PutResult,
    RequestProblem,
    StatusReply,
    StatusRequest,
    TriggerJob,
    TriggerResult,
    decode_request,
    manual_id_problem,
    subject,
)
from hrwcron.admin.jobtable import by_due, format_due_cursor, parse_due_cursor, summary
from hrwcron.core.errors import (
    ConflictError,
    InvalidInput,
    NotFoundError,
    Problem,
    SubjectTakenError,
)
from hrwcron.core.model import TRIGGER_ENVELOPE, JobSpec, TriggerMessage, encode, job_name_problem
from hrwcron.core.ticks import TickId, format_ms, manual_claim_key
from hrwcron.engine.ports import (
    HEADER_KIND,
    JobEvent,
    JobsPort,
    StoreRefused,
    StoreUnavailable,
    TriggerRecord,
    TriggersPort,
)
from hrwcron.engine.scheduler import Scheduler

log = logging.getLogger("hrwcron.admin")

# How many stored triggers a backfill may scan for tick keys already published.
SCAN_LIMIT = 200_000
# Scheduled ticks are never published before their due instant by the server's clock; this
# margin only covers the estimate of that clock.
SCAN_MARGIN_MS = 60_000
# How long a request waits for this replica's watch to deliver a job the bucket already holds.
CATCH_UP_S = 3.0
# Room left in every reply for the micro service's own framing.
REPLY_RESERVE = 1024
# An error reply says what is wrong; it never needs to be longer than this.
MAX_ERROR_REPLY = 64 * 1024
MAX_ERROR_TEXT = 4096
# What to ask for instead when a reply cannot fit; the paged verbs never get there.
TOO_LARGE_HINTS = {
    "backfill": "; backfill a shorter range (from, to)",
    "jobs.bulk": "; send fewer jobs per request",
}
# Jobs a reading handler walks before it lets the event loop run ticks again.
SLICE = 5_000


class ApiError(Exception):
    """A refused request: the reply carries ``code``, ``message`` and ``field``."""

    def __init__(
        self, code: str, message: str, field: str = "", problems: list[Problem] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.problems = problems or []

    def body(self) -> ErrorBody:
        return ErrorBody(
            code=self.code,
            message=self.message,
            field=self.field,
            problems=[ProblemBody(field=p.where, message=p.message) for p in self.problems],
        )


def _bad(field: str, message: str) -> ApiError:
    return ApiError("bad_request", f"{field}: {message}" if field else message, field)


def _check_name(name: str, field: str = "name") -> None:
    problem = job_name_problem(name)
    if problem:
        raise _bad(field, problem)


Handler = Callable[[Any], Awaitable[msgspec.Struct]]


class AdminService:
    def __init__(
        self,
        client: Client,
        scheduler: Scheduler,
        jobs: JobsPort,
        triggers: TriggersPort,
        *,
        duplicate_window: float,
        prefix: str = ADMIN_PREFIX,
    ) -> None:
        self._client = client
        self._scheduler = scheduler
        self._jobs = jobs
        self._triggers = triggers
        self._duplicate_window = duplicate_window
        self.prefix = prefix
        self._service: Service | None = None
        # Every stored job name, sorted, as of a jobs revision: pages of a listing find their
        # place in it by bisection instead of sorting 100,000 names for each page.
        self._names: tuple[int, list[str]] = (-1, [])
        self._handlers: dict[str, Handler] = {
            "jobs.list": self.list_jobs,
            "jobs.get": self.get_job,
            "jobs.put": self.put_job,
            "jobs.bulk": self.put_jobs,
            "jobs.delete": self.delete_job,
            "jobs.pause": self.pause_job,
            "jobs.resume": self.resume_job,
            "trigger": self.trigger,
            "backfill": self.backfill,
            "status": self.status,
            "history": self.history,
        }

    @property
    def service(self) -> Service | None:
        return self._service

    async def start(self) -> None:
        settings = self._scheduler.settings
        service = await add_service(
            self._client,
            name=SERVICE_NAME,
            version=__version__,
            description="hrwcron admin API: jobs, manual triggers, backfill, status, history",
            metadata={"node": settings.node_id, "prefix": self.prefix},
            queue_group=QUEUE_GROUP,
        )
        try:
            for verb, handler in self._handlers.items():
                await service.add_endpoint(
                    name=verb.replace(".", "-"),
                    subject=subject(verb, self.prefix),
                    handler=self._endpoint(verb, handler),
                )
        except BaseException:
            await service.stop()
            raise
        self._service = service
        log.info("admin API on %s.> (queue group %s)", self.prefix, QUEUE_GROUP)

    async def stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
            self._service = None

    # ------------------------------------------------------------------------- plumbing

    def _endpoint(self, verb: str, handler: Handler) -> Callable[[Request], Awaitable[None]]:
        request_type = REQUEST_TYPES[verb]

        async def serve(request: Request) -> None:
            try:
                try:
                    parsed = decode_request(request.data, request_type)
                except RequestProblem as exc:
                    raise _bad(exc.field, exc.message) from None
                reply = msgspec.json.encode(await handler(parsed))
                limit = self._client.max_payload
                if len(reply) > limit:
                    raise ApiError(
                        "too_large",
                        f"the reply would be {len(reply)} bytes, more than the server's "
                        f"max_payload ({limit}){TOO_LARGE_HINTS.get(verb, '')}",
                    )
            except Exception as exc:
                error = self._error(verb, exc)
                limit = min(MAX_ERROR_REPLY, self._client.max_payload - REPLY_RESERVE)
                await request.respond_error(
                    ERROR_CODES[error.code],
                    error.message.replace("\r", " ").replace("\n", " ")[:512],
                    data=_error_reply(error.body(), limit),
                )
                return
            await request.respond(reply)

        return serve

    @staticmethod
    def _error(verb: str, exc: Exception) -> ApiError:
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, SubjectTakenError):
            return ApiError("conflict", f"spec.subject: {exc}", "spec.subject")
        if isinstance(exc, ConflictError):
            return ApiError("conflict", str(exc), "revision")
        if isinstance(exc, NotFoundError):
            return ApiError("not_found", str(exc), "name")
        if isinstance(exc, InvalidInput):
            return ApiError("bad_request", str(exc), exc.field, exc.problems)
        unavailable = (
            StoreUnavailable,
            TimeoutError,
            NatsTimeoutError,
            NoRespondersError,
            ConnectionClosedError,
            ServiceUnavailableError,
            APIError,
        )
        if isinstance(exc, unavailable):
            return ApiError("unavailable", f"NATS did not serve the request: {exc!r}; retry")
        log.exception("admin %s failed", verb)
        return ApiError("internal", f"{type(exc).__name__}: {exc}")

    async def _stored(self, name: str) -> JobEvent:
        event = await self._jobs.get(name)
        if event is None:
            raise ApiError("not_found", f"no job named {name!r}", "name")
        return event

    async def _loaded(self, name: str) -> Any:
        """This replica's running copy of ``name``, waiting briefly for the jobs watch when the
        bucket already holds a newer revision (the job was just written through another
        replica)."""
        stored = await self._stored(name)
        if stored.spec is None:
            raise ApiError(
                "conflict", f"job {name!r} is stored but invalid ({stored.error}): put a new spec"
            )
        if name not in self._scheduler.jobs:
            # Written around the API (straight into the bucket): the replicas skip it.
            problems = self._spec_problems(stored.spec)
            if problems:
                found = "; ".join(map(str, problems))[:1000]
                raise ApiError(
                    "conflict", f"job {name!r} is stored but invalid ({found}): put a new spec"
                )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while True:
            job = self._scheduler.jobs.get(name)
            if job is not None and job.revision >= stored.revision:
                return job
            if loop.time() > deadline:
                raise ApiError(
                    "unavailable",
                    f"this replica has not loaded revision {stored.revision} of {name!r} yet; "
                    "retry",
                )
            await asyncio.sleep(0.05)

    # ----------------------------------------------------------------------------- jobs

    def _page(self, max_bytes: int, envelope: msgspec.Struct) -> _Page:
        """A page of at most ``max_bytes`` (0: as much as one message carries)."""
        hard = self._client.max_payload - REPLY_RESERVE
        return _Page(min(max_bytes, hard) if max_bytes else hard, hard, envelope)

    async def _caught_up(self) -> bool:
        """Whether this replica's jobs view holds every revision the bucket held when asked,
        waiting up to CATCH_UP_S for its watch; a write through another replica a moment ago
        is then in the view."""
        newest = await self._jobs.last_revision()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while self._scheduler.jobs_revision < newest:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _stored_names(self) -> list[str]:
        """Every stored job name (loaded or skipped), sorted; rebuilt only when the view has
        changed since the last listing."""
        scheduler = self._scheduler
        revision = scheduler.jobs_revision
        if self._names[0] != revision:
            self._names = (revision, sorted([*scheduler.jobs, *scheduler.skipped]))
        return self._names[1]

    async def list_jobs(self, request: ListJobs) -> JobList:
        """A page of the stored jobs, by name. Served from this replica's jobs view once it
        has caught up with the bucket (``unavailable`` when it stays behind, e.g. while it
        loads a large apply): a page costs its own entries, not a read of every job. Specs
        the replica skipped are read from the bucket as they are."""
        if not await self._caught_up():
            raise _behind()
        names = self._stored_names()
        low, high = _prefix_range(names, request.prefix)
        start = max(low, bisect.bisect_right(names, request.after)) if request.after else low
        chosen = names[start:high][: request.limit]
        page = self._page(request.max_bytes, JobList(jobs=[], total=high - low))
        entries: list[JobEntry] = []
        scheduler = self._scheduler
        for index, name in enumerate(chosen):
            job = scheduler.jobs.get(name)
            found = (
                JobEntry(name=name, revision=job.revision, spec=job.spec)
                if job is not None
                else await self._skipped_entry(name)
            )
            if found is None:
                continue  # deleted while this page was read
            entry = found
            if not page.fits(entry, first=not entries):
                if entries:
                    break
                entry = _without_spec(entry, page.size_of(entry))
                page.fits(entry, first=True)
            entries.append(entry)
            if index % SLICE == SLICE - 1:
                await asyncio.sleep(0)
        last = entries[-1].name if entries else ""
        more = bool(entries) and bisect.bisect_right(names, last) < high
        return JobList(jobs=entries, next=last if more else "", total=high - low)

    async def _skipped_entry(self, name: str) -> JobEntry | None:
        stored = await self._jobs.get(name)
        if stored is None:
            return None
        entry = _entry(stored)
        skipped = self._scheduler.skipped.get(name)
        if not entry.error and skipped is not None:
            entry.error = skipped[1]
        return entry

    async def get_job(self, request: GetJob) -> JobEntry:
        _check_name(request.name)
        return _entry(await self._stored(request.name))

    def _spec_problems(self, spec: JobSpec) -> list[Problem]:
        settings = self._scheduler.settings
        found = [
            Problem(f"spec.{p.where}" if p.where else "spec", p.message)
            for p in spec.problems(prefix=settings.subject_prefix, max_payload=settings.max_payload)
        ]
        if not any(p.where == "spec.payload" for p in found):
            size = len(msgspec.json.encode(spec.payload))
            server = self._client.max_payload
            if size + TRIGGER_ENVELOPE > server:
                found.append(
                    Problem(
                        "spec.payload",
                        f"is {size} bytes as JSON; with its trigger's envelope "
                        f"({TRIGGER_ENVELOPE} bytes) that is more than the NATS server's "
                        f"max_payload ({server} bytes)",
                    )
                )
        if spec.max_lateness > self._duplicate_window:
            found.append(
                Problem(
                    "spec.max_lateness",
                    f"is {spec.max_lateness:g} s, longer than the trigger stream's duplicate "
                    f"window ({self._duplicate_window:g} s)",
                )
            )
        return found

    async def put_job(self, request: PutJob) -> PutResult:
        spec = request.spec
        problems = self._spec_problems(spec)
        if problems:
            first = problems[0]
            raise ApiError(
                "bad_request",
                "; ".join(str(p) for p in problems),
                first.where,
                problems,
            )
        wanted = spec.trigger_subject(self._scheduler.settings.subject_prefix)
        other = self._scheduler.job_on_subject(wanted)
        if other is not None and other != spec.name:
            raise ApiError(
                "conflict",
                f"spec.subject: {_subject_taken(wanted, other)}",
                "spec.subject",
            )
        existing = await self._jobs.get(spec.name)
        now = int(self._scheduler.clock.now_ms())
        late = spec.never_fires_problem(existing.spec if existing else None, now)
        if late is not None:
            where = f"spec.{late.where}"
            raise ApiError(
                "bad_request", f"{where}: {late.message}", where, [Problem(where, late.message)]
            )
        if request.revision == 0 and existing is not None:
            raise ApiError(
                "conflict",
                f"job {spec.name!r} already exists (revision {existing.revision}); pass that "
                "revision to replace it",
                "revision",
            )
        revision = await self._jobs.put(spec, request.revision)
        log.info("job %s written (revision %d)", spec.name, revision)
        return PutResult(name=spec.name, revision=revision, created=existing is None)

    async def put_jobs(self, request: PutJobs) -> BulkResult:
        """Many writes and deletions at once. Every item is decoded and validated on its own
        (the rules of ``jobs.put`` and ``jobs.delete``, against this replica's caught-up view
        and the other items); the valid ones are written together, pipelined, each still
        compare-and-set and holding its subject claim, and each answered on its own."""
        if not await self._caught_up():
            raise _behind()
        plan = _BulkPlan(self._scheduler)
        for index, raw in enumerate(request.jobs):
            plan.add_put(index, raw, self._spec_problems)
        for index, raw in enumerate(request.delete):
            plan.add_delete(index, raw)
        if request.atomic and plan.refusals:
            plan.hold_back()
        elif not request.dry_run:
            await self._write(plan)
        result = BulkResult(jobs=plan.puts, deleted=plan.deletes, dry_run=request.dry_run)
        counts = plan.counts()
        if counts and not request.dry_run:
            log.info("bulk write: %s", ", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
        return _fit_bulk(result, self._client.max_payload - REPLY_RESERVE)

    async def _write(self, plan: _BulkPlan) -> None:
        writes = [(spec, revision) for _, spec, revision in plan.to_write]
        written = await self._jobs.put_many(writes) if writes else []
        for (index, spec, _), answer in zip(plan.to_write, written, strict=True):
            outcome = plan.puts[index]
            if isinstance(answer, int):
                outcome.revision = answer
            else:
                plan.puts[index] = _failed_write(spec.name, answer, "spec.subject")
        deletions = [(name, revision) for _, name, revision in plan.to_delete]
        deleted = await self._jobs.delete_many(deletions) if deletions else []
        for (index, name, _), error in zip(plan.to_delete, deleted, strict=True):
            if error is not None:
                plan.deletes[index] = _failed_write(name, error, "name")

    async def delete_job(self, request: DeleteJob) -> DeleteResult:
        _check_name(request.name)
        stored = await self._stored(request.name)
        if request.revision is not None and request.revision != stored.revision:
            raise _stale(request.name, request.revision, stored.revision)
        await self._jobs.delete(request.name, stored.revision)
        if stored.spec is not None:
            # Created anew later, the job gets all of its max_runs again.
            subject = stored.spec.trigger_subject(self._scheduler.settings.subject_prefix)
            await self._scheduler.reset_runs(request.name, subject)
        log.info("job %s deleted", request.name)
        return DeleteResult(name=request.name)

    async def pause_job(self, request: PauseJob) -> PauseResult:
        return await self._set_paused(request, True)

    async def resume_job(self, request: PauseJob) -> PauseResult:
        return await self._set_paused(request, False)

    async def _set_paused(self, request: PauseJob, paused: bool) -> PauseResult:
        _check_name(request.name)
        stored = await self._stored(request.name)
        if request.revision is not None and request.revision != stored.revision:
            raise _stale(request.name, request.revision, stored.revision)
        if stored.spec is None:
            raise ApiError(
                "conflict",
                f"job {request.name!r} is stored but invalid ({stored.error}): put a new spec",
            )
        if stored.spec.paused == paused:
            return PauseResult(
                name=request.name, revision=stored.revision, paused=paused, changed=False
            )
        changed = msgspec.structs.replace(stored.spec, paused=paused)
        revision = await self._jobs.put(changed, stored.revision)
        log.info(
            "job %s %s (revision %d)", request.name, "paused" if paused else "resumed", revision
        )
        return PauseResult(name=request.name, revision=revision, paused=paused, changed=True)

    # --------------------------------------------------------------------------- firing

    async def trigger(self, request: TriggerJob) -> TriggerResult:
        _check_name(request.name)
        manual_id = request.id or f"{int(self._scheduler.clock.now_ms())}-{uuid.uuid4().hex[:8]}"
        problem = manual_id_problem(manual_id)
        if problem:
            raise _bad("id", problem)
        job = await self._loaded(request.name)
        due = int(self._scheduler.clock.now_ms())
        tick = f"{request.name}:manual:{manual_id}"
        outcome = "duplicate"
        # A given id may have fired longer ago than its claim and the duplicate window last:
        # the stream itself says, for as long as it keeps the job's triggers. A generated id
        # is new by construction.
        if not request.id or not await self._in_stream(job.subject, tick):
            outcome = await self._scheduler.publish_unscheduled(
                request.name, tick, due, "manual", manual_claim_key(request.name, manual_id)
            )
        if outcome == "rejected":
            raise ApiError(
                "conflict",
                f"trigger {tick} was refused: {self._scheduler.problem_of(request.name)}; "
                "fix the job's spec",
                "name",
            )
        if outcome not in ("started", "duplicate"):
            raise ApiError("unavailable", f"trigger {tick} was not published ({outcome}); retry")
        log.info("manual trigger %s: %s", tick, outcome)
        return TriggerResult(
            name=request.name,
            tick=tick,
            outcome=outcome,
            due=format_ms(due),
            node=self._scheduler.node,
        )

    async def _in_stream(self, trigger_subject: str, msg_id: str) -> bool:
        stored = await self._triggers.since(trigger_subject, 0, SCAN_LIMIT)
        if len(stored) >= SCAN_LIMIT:
            raise ApiError(
                "too_large",
                f"the stream holds more than {SCAN_LIMIT} triggers of this job, too many to "
                "check the id against; trigger without --id",
                "id",
            )
        return any(record.msg_id == msg_id for record in stored)

    async def backfill(self, request: BackfillJob) -> BackfillResult:
        _check_name(request.name)
        start = _ms(request.start)
        end = _ms(request.end)
        now = self._scheduler.clock.now_ms()
        if end < start:
            raise _bad("to", f"{format_ms(end)} is before from ({format_ms(start)})")
        if end > now:
            raise _bad(
                "to",
                f"{format_ms(end)} is in the future (server time {format_ms(int(now))}); "
                "backfill covers past due instants only",
            )
        job = await self._loaded(request.name)
        due: list[int] = []
        # The job's ticks that fire: its window and exclusions apply to a backfill too.
        for instant in job.plan.iter_firing(start - 1):
            if instant > end:
                break
            due.append(instant)
            if len(due) > MAX_BACKFILL:
                raise ApiError(
                    "too_large",
                    f"from/to: the range holds more than {MAX_BACKFILL} due instants of "
                    f"{request.name!r} ({job.spec.schedule}); split it into smaller ranges",
                    "from",
                )
        recent = now - job.spec.max_lateness_ms
        older = [t for t in due if t <= recent]
        result = BackfillResult(
            name=request.name,
            due=len(due),
            published=[],
            present=[],
            left_to_scheduler=[TickId(request.name, t).key for t in due if t > recent],
            dry_run=request.dry_run,
        )
        if not older:
            return result
        stored = await self._triggers.since(job.subject, older[0] - SCAN_MARGIN_MS, SCAN_LIMIT)
        if len(stored) >= SCAN_LIMIT:
            raise ApiError(
                "too_large",
                f"more than {SCAN_LIMIT} triggers of {request.name!r} were stored since "
                f"{format_ms(older[0])}; split the range",
                "from",
            )
        seen = {record.msg_id for record in stored}
        for instant in older:
            key = TickId(request.name, instant).key
            if key in seen:
                result.present.append(key)
            elif request.dry_run:
                result.published.append(key)
            else:
                outcome = await self._scheduler.publish_unscheduled(
                    request.name, key, instant, "backfill", TickId(request.name, instant).claim_key
                )
                if outcome == "started":
                    result.published.append(key)
                elif outcome == "duplicate":
                    result.present.append(key)
                elif outcome == "rejected":
                    raise ApiError(
                        "conflict",
                        f"backfill stopped at {key}: "
                        f"{self._scheduler.problem_of(request.name)}; fix the job's spec",
                        "name",
                    )
                else:
                    raise ApiError(
                        "unavailable",
                        f"backfill stopped at {key} ({outcome}) after publishing "
                        f"{len(result.published)}; run it again: published ticks are skipped",
                    )
        if result.published and not request.dry_run:
            log.info("backfill of %s published %d ticks", request.name, len(result.published))
        return result

    # -------------------------------------------------------------------------- reading

    async def status(self, request: StatusRequest) -> StatusReply:
        """Members and the summary, then one page of jobs in name or due order: the summary
        is a few numbers at any number of jobs, so the first page always fits."""
        scheduler = self._scheduler
        if request.name:
            _check_name(request.name)
            if request.name not in scheduler.jobs:
                await self._loaded(request.name)
        try:
            after_due = parse_due_cursor(request.after) if request.order == "due" else None
        except ValueError as exc:
            raise _bad("after", str(exc)) from None
        ttl = scheduler.settings.member_ttl
        members = [
            MemberStatus(
                node=node,
                age_s=round(age, 3),
                live=age < ttl and heartbeat.ready,
                ready=heartbeat.ready,
                reason=heartbeat.reason,
                weight=heartbeat.weight,
                tags=list(heartbeat.tags),
                digest=heartbeat.digest,
                digest_matches=heartbeat.digest == scheduler.digest,
                version=heartbeat.version,
                jobs=heartbeat.jobs,
                started=format_ms(heartbeat.started_ms),
            )
            for node, (heartbeat, age) in sorted(scheduler.view.heartbeats().items())
        ]
        if request.name:
            names = [request.name]
        elif request.prefix:
            names = [n for n in scheduler.jobs if n.startswith(request.prefix)]
        else:
            names = list(scheduler.jobs)
        total = len(names)
        cursors: list[str]
        if request.order == "due":
            keys = await by_due(scheduler, names, after_due, request.limit + 1)
            names = [name for _, name in keys]
            cursors = [format_due_cursor(key) for key in keys]
        else:
            names.sort()
            names = [n for n in names if n > request.after] if request.after else names
            cursors = names
        reply = StatusReply(
            node=scheduler.node,
            ready=scheduler.ready,
            reason=scheduler.not_ready_reason,
            digest=scheduler.digest,
            members=members,
            jobs=[],
            total_jobs=total,
            truncated=False,
            summary=await summary(scheduler),
        )
        page = self._page(request.max_bytes, reply)
        jobs: list[JobStatus] = reply.jobs
        shown = 0
        for name in names[: request.limit]:
            job = scheduler.jobs.get(name)
            if job is None:
                shown += 1
                continue  # removed while this request was read
            spec = job.spec
            order = scheduler.ranking_of(name)
            last = scheduler.last.get(job.subject)
            progress = scheduler.progress(name)
            due = progress.next_due
            status = JobStatus(
                name=name,
                schedule=spec.schedule,
                tz=spec.tz,
                paused=spec.paused,
                tags=list(spec.tags),
                overlap=spec.overlap,
                subject=job.subject,
                revision=job.revision,
                owner=order[0] if order else None,
                order=order,
                next_due=None if due is None else format_ms(due),
                next_fire=None if due is None else format_ms(due + job.jitter_ms),
                last=LastTriggerStatus(seq=last.seq, tick=last.msg_id) if last else None,
                problem=scheduler.problem_of(name),
                state=progress.state,
                runs_done=progress.runs_done,
                runs_left=progress.runs_left,
            )
            if not page.fits(status, first=not jobs):
                break
            jobs.append(status)
            shown += 1
        reply.truncated = len(names) > shown
        reply.next = cursors[shown - 1] if reply.truncated and shown else ""
        return reply

    async def history(self, request: HistoryRequest) -> HistoryReply:
        _check_name(request.name)
        job = self._scheduler.jobs.get(request.name)
        if job is not None:
            trigger_subject = job.subject
        else:
            stored = await self._stored(request.name)
            if stored.spec is None:
                raise ApiError("conflict", f"job {request.name!r} is stored but invalid")
            trigger_subject = stored.spec.trigger_subject(self._scheduler.settings.subject_prefix)
        # One more than asked, to know whether older triggers are left for another page.
        records = await self._triggers.history(
            trigger_subject, request.limit + 1, before_seq=request.before
        )
        newest_first = records[::-1]
        reply = HistoryReply(name=request.name, subject=trigger_subject, triggers=[])
        page = self._page(request.max_bytes, reply)
        for record in newest_first[: request.limit]:
            entry = _history_entry(record)
            if not page.fits(entry, first=not reply.triggers):
                if reply.triggers:
                    break
                entry = msgspec.structs.replace(
                    entry,
                    payload=None,
                    omitted=f"the payload is {len(record.body)} bytes, more than fits in a reply",
                )
                page.fits(entry, first=True)
            reply.triggers.append(entry)
        more = len(newest_first) > len(reply.triggers)
        reply.next = reply.triggers[-1].seq if more and reply.triggers else 0
        return reply


class _BulkPlan:
    """The answers to one bulk request as its items are checked, and what is left to write."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._prefix = scheduler.settings.subject_prefix
        self.puts: list[JobOutcome] = []
        self.deletes: list[JobOutcome] = []
        self.to_write: list[tuple[int, JobSpec, int | None]] = []
        self.to_delete: list[tuple[int, str, int | None]] = []
        self.refusals = 0
        self._names: set[str] = set()
        self._subjects: dict[str, str] = {}

    def _stored_revision(self, name: str) -> int:
        job = self._scheduler.jobs.get(name)
        if job is not None:
            return job.revision
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
            self.puts.append(self._refuse(_name_in(raw), "refused", [problem]))
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
            problems.append(Problem("spec.subject", _subject_taken(subject, holder)))
        self._names.add(spec.name)
        if problems:
            self.puts.append(self._refuse(spec.name, "refused", problems))
            return
        self._subjects[subject] = spec.name  # only an accepted job holds it in the request
        current = self._scheduler.jobs.get(spec.name)
        stored = self._stored_revision(spec.name)
        if current is not None and encode(current.spec) == encode(spec):
            self.puts.append(JobOutcome(name=spec.name, outcome="unchanged", revision=stored))
            return
        conflict = _revision_conflict(spec.name, item.revision, stored)
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
            self.deletes.append(self._refuse(_name_in(raw), "refused", [problem]))
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
            conflict = _revision_conflict(item.name, item.revision, stored) or ""
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


def _revision_conflict(name: str, asked: int | None, stored: int) -> str | None:
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


def _failed_write(name: str, error: Exception, subject_field: str) -> JobOutcome:
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


def _name_in(raw: msgspec.Raw) -> str:
    """The job name an undecodable item gives, for its answer (empty when it gives none)."""
    try:
        item = msgspec.json.decode(raw, type=dict[str, Any])
    except (msgspec.MsgspecError, RecursionError):
        return ""
    spec = item.get("spec")
    name = spec.get("name") if isinstance(spec, dict) else item.get("name")
    return name[:600] if isinstance(name, str) else ""


def _fit_bulk(result: BulkResult, limit: int) -> BulkResult:
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


def _behind() -> ApiError:
    return ApiError(
        "unavailable",
        f"this replica is still loading job changes (more than {CATCH_UP_S:g} s behind the "
        "jobs bucket); retry",
    )


def _prefix_range(names: Sequence[str], prefix: str) -> tuple[int, int]:
    """The slice of sorted ``names`` that start with ``prefix``."""
    if not prefix:
        return 0, len(names)
    low = bisect.bisect_left(names, prefix)
    return low, bisect.bisect_left(names, prefix + "\U0010ffff", low)


def _subject_taken(subject: str, holder: str) -> str:
    return (
        f"{subject!r} is already the trigger subject of job {holder!r}; each job needs its "
        "own (fencing is per subject)"
    )


def _stale(name: str, asked: int, stored: int) -> ApiError:
    return ApiError(
        "conflict",
        f"job {name!r} changed since revision {asked} (it is at revision {stored} now): "
        "read it again and retry",
        "revision",
    )


def _ms(instant: Any) -> int:
    return int(instant.timestamp() * 1000)


def _entry(event: JobEvent) -> JobEntry:
    return JobEntry(name=event.name, revision=event.revision, spec=event.spec, error=event.error)


def _without_spec(entry: JobEntry, size: int) -> JobEntry:
    return JobEntry(
        name=entry.name,
        revision=entry.revision,
        error=f"the stored spec is {size} bytes, more than fits in a reply: {entry.error[:200]}",
    )


# Room for a page's cursor: a job name is at most 519 characters, a sequence 20 digits.
CURSOR_ROOM = 600


class _Page:
    """Counts the bytes of a reply while entries are added to it, so a page ends before the
    reply outgrows ``budget``. ``envelope`` is the reply without entries and cursor."""

    def __init__(self, budget: int, hard: int, envelope: msgspec.Struct) -> None:
        self.budget = budget
        self.hard = hard
        self.used = len(msgspec.json.encode(envelope)) + CURSOR_ROOM

    @staticmethod
    def size_of(entry: msgspec.Struct) -> int:
        return len(msgspec.json.encode(entry)) + 1  # and its comma

    def fits(self, entry: msgspec.Struct, *, first: bool = False) -> bool:
        """Takes ``entry`` if it fits the budget. The first entry of a page only has to fit
        one message, so a page always makes progress, even with a tiny ``max_bytes``."""
        size = self.size_of(entry)
        if self.used + size > (self.hard if first else self.budget):
            return False
        self.used += size
        return True


def _error_reply(body: ErrorBody, limit: int) -> bytes:
    """The error reply, cut to ``limit`` bytes: long texts shortened, problems beyond what
    fits dropped with a note saying how many."""
    text = min(MAX_ERROR_TEXT, limit // 4)
    message, field = body.message[:text], body.field[:200]
    kept: list[ProblemBody] = []
    base = ErrorReply(error=ErrorBody(code=body.code, message=message, field=field))
    used = len(msgspec.json.encode(base)) + 100  # and the note on dropped problems
    for problem in body.problems:
        short = ProblemBody(field=problem.field[:200], message=problem.message[:text])
        size = len(msgspec.json.encode(short)) + 1
        if used + size > limit:
            break
        kept.append(short)
        used += size
    dropped = len(body.problems) - len(kept)
    if dropped:
        kept.append(ProblemBody(field="", message=f"... and {dropped} more problems"))
    trimmed = ErrorBody(code=body.code, message=message, field=field, problems=kept)
    return msgspec.json.encode(ErrorReply(error=trimmed))


def _history_entry(record: TriggerRecord) -> HistoryEntry:
    stored = format_ms(int(record.stored_ms))
    try:
        body = msgspec.json.decode(record.body, type=TriggerMessage)
    except msgspec.MsgspecError:
        return HistoryEntry(
            seq=record.seq,
            tick=record.msg_id,
            kind=record.headers.get(HEADER_KIND, "?"),
            due="",
            fired_at="",
            stored=stored,
            node="",
            attempt=0,
        )
    return HistoryEntry(
        seq=record.seq,
        tick=record.msg_id or body.tick,
        kind=body.kind,
        due=body.due,
        fired_at=body.fired_at,
        stored=stored,
        node=body.node,
        attempt=body.attempt,
        payload=body.payload,
    )
