"""The job table alone, on the in-memory jobs bucket: what it loads, skips, replaces and drops,
the digest the replicas compare, and what it tells the engine through its hooks."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from harness import wait_for_async
from harness.engine_parts import event, table
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import JobEvent, LastTrigger


def test_a_valid_job_is_loaded_planned_and_announced() -> None:
    jobs, hooks, _ = table()
    jobs.apply(event("a", 1))
    job = jobs.jobs["a"]
    assert job.due is not None and job.revision == 1
    assert jobs.by_subject[job.subject] == "a"
    assert hooks.prepared == ["a"] and hooks.loaded_jobs == [job]
    assert hooks.unknown == ["a"]  # a new job reads its run count
    assert jobs.digest == job.digest != 0


def test_an_older_revision_changes_nothing_and_a_delete_drops_the_job() -> None:
    jobs, hooks, _ = table()
    jobs.apply(event("a", 2))
    first = jobs.jobs["a"]
    jobs.apply(event("a", 1, paused=True))
    assert jobs.jobs["a"] is first
    entry = first.entry
    jobs.apply(JobEvent("a", None, 3))
    assert "a" not in jobs.jobs and jobs.by_subject == {}
    assert jobs.digest == 0
    assert first.entry == entry + 1  # its heap entry and any act in flight are invalidated
    assert hooks.unknown == ["a", "a"]


def test_a_paused_job_is_loaded_without_a_due_tick() -> None:
    jobs, _, _ = table()
    jobs.apply(event("p", 1, paused=True))
    assert jobs.jobs["p"].due is None


def test_a_new_job_starts_after_the_tick_its_subject_already_holds() -> None:
    jobs, _, _ = table()
    subject = JobSpec(name="a", schedule="@every 1m").trigger_subject("hrwcron.trigger")
    far = 4_000_000_000_000  # a watermark far ahead: the next due tick comes after it
    jobs_after, _, _ = table({subject: LastTrigger(1, "x", far)})
    jobs.apply(event("a", 1))
    jobs_after.apply(event("a", 1))
    assert (jobs.jobs["a"].due or 0) < far < (jobs_after.jobs["a"].due or 0)


@pytest.mark.parametrize(
    "bad",
    [
        JobEvent("a", JobSpec(name="b", schedule="@every 1m"), 1),  # key and name differ
        JobEvent("a", JobSpec(name="a", schedule="not a schedule"), 1),
        JobEvent("a", None, 1, error="cannot decode"),
    ],
)
def test_a_bad_spec_is_skipped_with_its_reason(bad: JobEvent) -> None:
    jobs, hooks, _ = table()
    jobs.apply(bad)
    assert "a" not in jobs.jobs and hooks.loaded_jobs == []
    revision, why = jobs.skipped["a"]
    assert revision == 1 and why


def test_a_job_the_engine_cannot_plan_is_skipped_not_raised() -> None:
    jobs, hooks, _ = table()
    hooks.refuse.add("a")
    jobs.apply(event("a", 1))
    assert "a" not in jobs.jobs
    assert jobs.skipped["a"][1].startswith("cannot be scheduled")
    jobs.apply(JobEvent("a", JobSpec(name="a", schedule="@every 2m"), 2))
    assert "a" in jobs.skipped  # still refused
    hooks.refuse.clear()
    jobs.apply(JobEvent("a", JobSpec(name="a", schedule="@every 2m"), 3))
    assert "a" in jobs.jobs and "a" not in jobs.skipped


async def test_the_watch_loads_the_bucket_then_follows_it() -> None:
    store = MemoryJobs()
    jobs, _, spawned = table(store=store)
    await store.put(JobSpec(name="a", schedule="@every 1m"), None)
    jobs.start_watch()
    try:
        await wait_for_async(jobs.loaded.is_set, timeout=5, message="jobs loaded")
        assert set(jobs.jobs) == {"a"} and jobs.revision >= 1
        revision = await store.put(JobSpec(name="b", schedule="@every 1m"), None)
        await wait_for_async(lambda: "b" in jobs.jobs, timeout=5, message="b loaded")
        assert jobs.revision == revision
    finally:
        jobs.stopping = True
        for task in spawned.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
