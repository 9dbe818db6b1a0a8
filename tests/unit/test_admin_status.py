"""``status`` at any size: a summary of every job in one reply, then pages of jobs soonest due
first; ``jobs.list`` from the replica's view, skipped specs included."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from harness import wait_for_async
from harness.admin_calls import call, refusal
from harness.serving import engine, serving
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.api import JobList, StatusReply
from hrwcron.admin.status import ReplicaStatus
from hrwcron.core.model import JobSpec


async def status(svc: object, **request: object) -> StatusReply:
    req = await call(svc, "status", request)  # type: ignore[arg-type]
    assert req.reply is not None, req.error
    return msgspec.json.decode(req.reply, type=StatusReply)


def test_the_summary_counts_every_job_and_the_table_pages_soonest_due_first() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        # Daily at a different hour each: due order is the hour order, not the name order.
        for hour in range(24):
            await jobs.put(JobSpec(name=f"h{23 - hour:02d}", schedule=f"0 {hour} * * *"), 0)
        await jobs.put(JobSpec(name="a.paused", schedule="@hourly", paused=True), 0)
        await jobs.put(JobSpec(name="badzone", schedule="@hourly", tz="Nowhere/Else"), 0)
        # Tagged for a member that does not exist: nobody fires it, every tick is missed.
        nobody = JobSpec(name="orphan", schedule="@every 1s", max_lateness=0.1, tags=["gpu"])
        await jobs.put(nobody, 0)
        async with serving(jobs) as svc:

            async def missed() -> bool:
                reply = await status(svc, limit=1)
                return reply.summary.missed_last_hour >= 1 and bool(reply.summary.owned)

            await wait_for_async(missed, timeout=20, message="a missed tick and a recount")
            first = await status(svc, order="due", limit=5)
            s = first.summary
            assert (s.jobs, s.paused, s.bad, s.no_owner) == (26, 1, 1, 1)
            assert s.owned == {"t": 25}
            assert first.total_jobs == 26 and first.truncated
            # The orphan fires every second, then the daily jobs by hour; paused ones last.
            assert first.jobs[0].name == "orphan"
            fires = [j.next_fire for j in first.jobs]
            assert fires == sorted(fires)
            rows = [(j.next_fire, j.name) for j in first.jobs]
            after = first.next
            while after:
                page = await status(svc, order="due", limit=7, after=after)
                assert page.summary.jobs == 26
                rows += [(j.next_fire, j.name) for j in page.jobs]
                after = page.next
            assert len({name for _, name in rows}) == 26
            # Across pages: soonest firing first (ties by name), the paused job last.
            assert rows[-1] == (None, "a.paused")
            timed = [(fire or "", name) for fire, name in rows[1:-1]]
            assert timed == sorted(timed) and all(fire for fire, _ in timed)
            by_name = await status(svc, limit=3)
            assert [j.name for j in by_name.jobs] == ["a.paused", "h00", "h01"]
            bad = refusal(await call(svc, "status", {"order": "due", "after": "soon"}))
            assert bad[1].field == "after"

    asyncio.run(scenario())


def test_jobs_list_serves_loaded_and_skipped_specs_with_a_total() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        for i in range(5):
            await jobs.put(JobSpec(name=f"p.{i}", schedule="@hourly"), 0)
        await jobs.put(JobSpec(name="p.bad", schedule="@hourly", tz="Nowhere/Else"), 0)
        await jobs.put(JobSpec(name="q", schedule="@daily"), 0)
        async with serving(jobs) as svc:
            seen: list[str] = []
            after = ""
            while True:
                req = await call(svc, "jobs.list", {"prefix": "p.", "after": after, "limit": 2})
                page = msgspec.json.decode(req.reply or b"", type=JobList)
                assert page.total == 6
                seen += [e.name for e in page.jobs]
                if not page.next:
                    break
                after = page.next
            assert seen == ["p.0", "p.1", "p.2", "p.3", "p.4", "p.bad"]
            req = await call(svc, "jobs.list", {"after": "p.4"})
            page = msgspec.json.decode(req.reply or b"", type=JobList)
            assert [e.name for e in page.jobs] == ["p.bad", "q"] and page.total == 7
            skipped = page.jobs[0]
            assert skipped.spec is not None and "Nowhere/Else" in skipped.error
            # A job written a moment ago is listed at once: the list waits for the view.
            await jobs.put(JobSpec(name="p.5", schedule="@hourly"), 0)
            req = await call(svc, "jobs.list", {"prefix": "p.5"})
            assert [e.name for e in msgspec.json.decode(req.reply or b"", type=JobList).jobs] == [
                "p.5"
            ]

    asyncio.run(scenario())


def test_the_http_status_document_has_the_summary_and_pages_soonest_due_first() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        for minute in range(30):
            await jobs.put(JobSpec(name=f"m{29 - minute:02d}", schedule=f"{minute} * * * *"), 0)
        await jobs.put(JobSpec(name="other", schedule="@daily", paused=True), 0)
        async with engine(jobs) as scheduler:
            source = ReplicaStatus(scheduler, Telemetry(node="t", process_metrics=False))
            first = await source.status(limit=8, prefix="m")
            assert first["summary"]["jobs"] == 31 and first["summary"]["paused"] == 1
            assert first["jobs_total"] == 30 and len(first["jobs"]) == 8 and first["next"]
            rows = [(j["next_fire_ms"], j["name"]) for j in first["jobs"]]
            after = first["next"]
            while after:
                page = await source.status(limit=8, prefix="m", after=after)
                rows += [(j["next_fire_ms"], j["name"]) for j in page["jobs"]]
                after = page["next"]
            assert rows == sorted(rows) and len(rows) == 30
            with pytest.raises(ValueError, match="cursor"):
                await source.status(after="m01")

    asyncio.run(scenario())
