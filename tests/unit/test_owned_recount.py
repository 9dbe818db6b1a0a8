"""The owned-jobs recount after every change of the job set (issue 25), on the in-memory stores:
deletes, and replacements by specs a replica skips, bring the counts down; ``no_owner`` is the
recount's own difference, not a clamped one."""

from __future__ import annotations

import asyncio

from harness import wait_for_async
from harness.engine_parts import event, table
from harness.serving import engine
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin.job_pages import summary
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import JobEvent

DEADLINE = 10.0


def test_deletes_and_skipped_replacements_bring_the_owned_count_down() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        for i in range(6):
            await jobs.put(JobSpec(name=f"own.{i}", schedule="@every 1h"), None)
        async with engine(jobs) as scheduler:

            async def owned(count: int) -> bool:
                s = await summary(scheduler)
                return s.jobs == count and s.owned.get("t", 0) == count and s.no_owner == 0

            await wait_for_async(lambda: owned(6), DEADLINE, message="t owns 6")
            for i in range(1, 6):
                await jobs.delete(f"own.{i}", None)
            await wait_for_async(lambda: owned(1), DEADLINE, message="t owns 1 after deletes")
            assert scheduler.counted_jobs == 1

            # Replaced by a spec the table skips (exclusions no bounded search can decide).
            evil = JobSpec(
                name="own.0",
                schedule="* * * * * *",
                exclude=["0-58 * * * * *", "59 * * * * *"],
            )
            await jobs.put(evil, None)
            await wait_for_async(lambda: owned(0), DEADLINE, message="t owns nothing")
            assert (await summary(scheduler)).bad == 1

    asyncio.run(scenario())


def test_a_job_leaving_the_table_for_a_bad_spec_is_reported_removed() -> None:
    jobs, hooks, _ = table()
    jobs.apply(event("a", 1))
    jobs.apply(JobEvent("a", JobSpec(name="a", schedule="61 * * * *"), 2))
    assert "a" not in jobs.jobs and hooks.removed_jobs == ["a"]


def test_a_job_leaving_the_table_for_a_spec_that_cannot_be_planned_is_reported_removed() -> None:
    jobs, hooks, _ = table()
    jobs.apply(event("a", 1))
    hooks.refuse.add("a")  # the engine cannot plan the new revision
    jobs.apply(JobEvent("a", JobSpec(name="a", schedule="@every 2m"), 2))
    assert "a" not in jobs.jobs and jobs.skipped["a"][1].startswith("cannot be scheduled")
    assert hooks.removed_jobs == ["a"]  # else the owned-jobs recount is not triggered
