"""The handlers of the jobs verbs: list, get, put, bulk, delete, pause and resume."""

from __future__ import annotations

import asyncio
import bisect
import logging

import msgspec

from hrwcron.admin.api import (
    BulkResult,
    DeleteJob,
    DeleteResult,
    GetJob,
    JobEntry,
    JobList,
    ListJobs,
    PauseJob,
    PauseResult,
    PutJob,
    PutJobs,
    PutResult,
)
from hrwcron.admin.bulk import BulkPlan, failed_write, fit_bulk, name_in, read_elsewhere
from hrwcron.admin.context import SLICE, ServiceContext
from hrwcron.admin.replies import (
    REPLY_RESERVE,
    ApiError,
    behind,
    check_name,
    job_entry,
    merged_page,
    prefix_range,
    stale,
    subject_taken,
    without_spec,
)
from hrwcron.core.errors import (
    Problem,
)
from hrwcron.core.plan import REQUEST_SEARCH_BUDGET, Allowance
from hrwcron.engine.pacing import Slices

log = logging.getLogger("hrwcron.admin")

# Search steps a bulk write may spend checking its items' exclusions, all items together: a
# real calendar of exclusions costs a handful of steps per job, so 10,000 such jobs fit, while
# a request of specs built to exhaust the search is bounded (refused past it, item by item).
BULK_SEARCH_BUDGET = 2 * REQUEST_SEARCH_BUDGET


class JobVerbs(ServiceContext):
    """Reading and writing job specs; every write goes through the port the replicas watch."""

    async def list_jobs(self, request: ListJobs) -> JobList:
        """A page of the stored jobs, by name. Served from this replica's jobs view once it
        has caught up with the bucket (``unavailable`` when it stays behind, e.g. while it
        loads a large apply): a page costs its own entries, not a read of every job. Specs
        the replica skipped are read from the bucket as they are."""
        if self._scheduler.settings.holders > 0 and not request.share:
            return await self._list_everywhere(request)
        if not await self._caught_up():
            raise behind()
        names = self._listed_names() if request.share else self._stored_names()
        low, high = prefix_range(names, request.prefix)
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
                entry = without_spec(entry, page.size_of(entry))
                page.fits(entry, first=True)
            entries.append(entry)
            if index % SLICE == SLICE - 1:
                await asyncio.sleep(0)
        last = entries[-1].name if entries else ""
        more = bool(entries) and bisect.bisect_right(names, last) < high
        return JobList(jobs=entries, next=last if more else "", total=high - low)

    async def _list_everywhere(self, request: ListJobs) -> JobList:
        """A page of every stored job when each replica holds a share: the same page asked
        of every live member for the lanes it lists, merged in name order. A page of one
        member stops at its ``max_bytes``; the merged page then stops at that member's last
        name, so the next page misses nothing of it."""
        asked = msgspec.structs.replace(request, share=True)
        pages = await self._ask_every_member("jobs.list", asked, JobList)
        total = sum(page.total for page in pages)
        shares = [([(e.name, e.name, e) for e in page.jobs], bool(page.next)) for page in pages]
        envelope = JobList(jobs=[], total=total)
        envelope.jobs, envelope.next = merged_page(
            shares, self._page(request.max_bytes, envelope), request.limit
        )
        return envelope

    def _listed_names(self) -> list[str]:
        """The names this replica lists for a merged page: its held jobs of the lanes it is
        the first live holder of (core/partitions.py), the tagged lane's when it is first;
        kept while neither the jobs nor the members change, as a listing is many pages."""
        scheduler = self._scheduler
        key = (scheduler.jobs_revision, scheduler.members_generation)
        if self._listed[0] != key:
            names = [name for name in self._stored_names() if scheduler.lists(name)]
            self._listed = (key, names)  # a sorted list filtered stays sorted
        return self._listed[1]

    async def _skipped_entry(self, name: str) -> JobEntry | None:
        stored = await self._jobs.get(name)
        if stored is None:
            return None
        entry = job_entry(stored)
        skipped = self._scheduler.skipped.get(name)
        if not entry.error and skipped is not None:
            entry.error = skipped[1]
        return entry

    async def get_job(self, request: GetJob) -> JobEntry:
        check_name(request.name)
        return job_entry(await self._stored(request.name))

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
                f"spec.subject: {subject_taken(wanted, other)}",
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
            raise behind()
        deleted = [name_in(raw) for raw in request.delete]
        elsewhere = await read_elsewhere(self._scheduler, self._jobs, request.jobs, deleted)
        plan = BulkPlan(self._scheduler, elsewhere)
        allowance = Allowance(BULK_SEARCH_BUDGET)
        slices = Slices()
        for index, raw in enumerate(request.jobs):
            plan.add_put(index, raw, lambda spec: self._spec_problems(spec, allowance))
            if slices.spent():
                await asyncio.sleep(0)
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
        return fit_bulk(result, self._client.max_payload - REPLY_RESERVE)

    async def _write(self, plan: BulkPlan) -> None:
        writes = [(spec, revision) for _, spec, revision in plan.to_write]
        written = await self._jobs.put_many(writes) if writes else []
        for (index, spec, _), answer in zip(plan.to_write, written, strict=True):
            outcome = plan.puts[index]
            if isinstance(answer, int):
                outcome.revision = answer
            else:
                plan.puts[index] = failed_write(spec.name, answer, "spec.subject")
        deletions = [(name, revision) for _, name, revision in plan.to_delete]
        deleted = await self._jobs.delete_many(deletions) if deletions else []
        for (index, name, _), error in zip(plan.to_delete, deleted, strict=True):
            if error is not None:
                plan.deletes[index] = failed_write(name, error, "name")

    async def delete_job(self, request: DeleteJob) -> DeleteResult:
        check_name(request.name)
        stored = await self._stored(request.name)
        if request.revision is not None and request.revision != stored.revision:
            raise stale(request.name, request.revision, stored.revision)
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
        check_name(request.name)
        stored = await self._stored(request.name)
        if request.revision is not None and request.revision != stored.revision:
            raise stale(request.name, request.revision, stored.revision)
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
