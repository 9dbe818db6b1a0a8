"""The handlers of the firing and reading verbs: trigger, backfill, status and history."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from hrwcron.admin.api import (
    MAX_BACKFILL,
    BackfillJob,
    BackfillResult,
    HistoryEntry,
    HistoryReply,
    HistoryRequest,
    JobStatus,
    LastTriggerStatus,
    MemberStatus,
    StatusReply,
    StatusRequest,
    TriggerJob,
    TriggerResult,
    manual_id_problem,
)
from hrwcron.admin.context import ServiceContext
from hrwcron.admin.job_pages import (
    add_summaries,
    by_due,
    format_due_cursor,
    parse_due_cursor,
    summary,
)
from hrwcron.admin.replies import (
    ApiError,
    bad,
    check_name,
    epoch_ms,
    merged_page,
)
from hrwcron.core.errors import SearchExhausted
from hrwcron.core.model import TriggerMessage
from hrwcron.core.outcomes import PUBLISHED, Outcome
from hrwcron.core.plan import SEARCH_BUDGET, Allowance
from hrwcron.core.ticks import TickId, format_ms, manual_claim_key
from hrwcron.engine.pacing import Slices
from hrwcron.engine.ports import (
    HEADER_KIND,
    TriggerRecord,
)

log = logging.getLogger("hrwcron.admin")

# How many stored triggers a backfill may scan for tick keys already published.
SCAN_LIMIT = 200_000
# Scheduled ticks are never published before their due instant by the server's clock; this
# margin only covers the estimate of that clock.
SCAN_MARGIN_MS = 60_000


class RunVerbs(ServiceContext):
    """Firing by hand and backfilling through the engine's claim and fenced publish, and
    reading what the replicas did."""

    async def trigger(self, request: TriggerJob) -> TriggerResult:
        check_name(request.name)
        manual_id = request.id or f"{int(self._scheduler.clock.now_ms())}-{uuid.uuid4().hex[:8]}"
        problem = manual_id_problem(manual_id)
        if problem:
            raise bad("id", problem)
        job = await self._loaded(request.name)
        due = int(self._scheduler.clock.now_ms())
        tick = f"{request.name}:manual:{manual_id}"
        outcome = Outcome.DUPLICATE
        # A given id may have fired longer ago than its claim and the duplicate window last:
        # the stream itself says, for as long as it keeps the job's triggers. A generated id
        # is new by construction.
        if not request.id or not await self._in_stream(job.subject, tick):
            outcome = await self._scheduler.publish_unscheduled(
                request.name, tick, due, "manual", manual_claim_key(request.name, manual_id)
            )
        if outcome == Outcome.REJECTED:
            raise ApiError(
                "conflict",
                f"trigger {tick} was refused: {self._scheduler.problem_of(request.name)}; "
                "fix the job's spec",
                "name",
            )
        if outcome not in PUBLISHED:
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
        check_name(request.name)
        start = epoch_ms(request.start)
        end = epoch_ms(request.end)
        now = self._scheduler.clock.now_ms()
        if end < start:
            raise bad("to", f"{format_ms(end)} is before from ({format_ms(start)})")
        if end > now:
            raise bad(
                "to",
                f"{format_ms(end)} is in the future (server time {format_ms(int(now))}); "
                "backfill covers past due instants only",
            )
        job = await self._loaded(request.name)
        due: list[int] = []
        # The job's ticks that fire: its window and exclusions apply to a backfill too. The
        # search is bounded: a step per tick listed, and the search bound for the gaps.
        firing = job.plan.iter_firing(
            start - 1, until=end, allowance=Allowance(MAX_BACKFILL + SEARCH_BUDGET)
        )
        try:
            for instant in firing:
                due.append(instant)
                if len(due) > MAX_BACKFILL:
                    break
        except SearchExhausted:
            raise ApiError(
                "too_large",
                f"from/to: the exclusions of {request.name!r} leave its ticks too sparse "
                "to list in bounded work; give a shorter range",
                "from",
            ) from None
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
                if outcome == Outcome.STARTED:
                    result.published.append(key)
                elif outcome == Outcome.DUPLICATE:
                    result.present.append(key)
                elif outcome == Outcome.REJECTED:
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
            check_name(request.name)
            if request.name not in scheduler.jobs:
                await self._loaded(request.name)
        try:
            after_due = parse_due_cursor(request.after) if request.order == "due" else None
        except ValueError as exc:
            raise bad("after", str(exc)) from None
        if scheduler.settings.holders > 0 and not request.name and not request.share:
            return await self._status_everywhere(request)
        members = self._member_statuses()
        if request.name:
            names = [request.name]
        else:
            names = [
                n
                for n in scheduler.jobs
                if n.startswith(request.prefix) and (not request.share or scheduler.lists(n))
            ]
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
            summary=await summary(scheduler, listed=request.share),
        )
        page = self._page(request.max_bytes, reply)
        jobs: list[JobStatus] = reply.jobs
        shown = 0
        await scheduler.refresh_last(names[: request.limit])
        allowance = Allowance()
        slices = Slices()
        for name in names[: request.limit]:
            if slices.spent():
                await asyncio.sleep(0)
            job = scheduler.jobs.get(name)
            if job is None:
                shown += 1
                continue  # removed while this request was read
            spec = job.spec
            order = scheduler.ranking_of(name)
            last = scheduler.last.get(job.subject)
            progress = scheduler.progress(name, allowance)
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
            if request.share:
                reply.cursors.append(cursors[shown])
                page.used += len(cursors[shown]) + 3
            shown += 1
        reply.truncated = len(names) > shown
        reply.next = cursors[shown - 1] if reply.truncated and shown else ""
        return reply

    async def _status_everywhere(self, request: StatusRequest) -> StatusReply:
        """Holding shares: the same page asked of every live member for the jobs it lists,
        merged in the page's order, with the members' summaries added up. As for a merged
        listing, the page stops at the last job of a member whose own page stopped short."""
        asked = msgspec.structs.replace(request, share=True)
        replies = await self._ask_every_member("status", asked, StatusReply)
        key: Callable[[str], Any] = parse_due_cursor if request.order == "due" else str
        scheduler = self._scheduler
        reply = StatusReply(
            node=scheduler.node,
            ready=scheduler.ready,
            reason=scheduler.not_ready_reason,
            digest=scheduler.digest,
            members=self._member_statuses(),
            jobs=[],
            total_jobs=sum(r.total_jobs for r in replies),
            truncated=False,
            summary=add_summaries(r.summary for r in replies),
        )
        shares = [
            (list(zip(map(key, r.cursors), r.cursors, r.jobs, strict=True)), r.truncated)
            for r in replies
        ]
        reply.jobs, reply.next = merged_page(
            shares, self._page(request.max_bytes, reply), request.limit
        )
        reply.truncated = bool(reply.next)
        return reply

    def _member_statuses(self) -> list[MemberStatus]:
        scheduler = self._scheduler
        ttl = scheduler.settings.member_ttl
        return [
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

    async def history(self, request: HistoryRequest) -> HistoryReply:
        check_name(request.name)
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
            entry = history_entry(record)
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


def history_entry(record: TriggerRecord) -> HistoryEntry:
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
