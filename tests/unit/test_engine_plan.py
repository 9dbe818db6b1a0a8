"""The engine with schedules that begin and end, over the in-memory stores: one-time jobs,
windows, exclusions, run limits and delete_after, several replicas in one event loop.

The new fields only decide which instants are ticks; each test also checks that what did fire
went through the ordinary tick (its key is ``<job>:<due ms>``, at most once per tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace

import msgspec
import pytest

from harness import wait_for_async
from harness.observers import RecordingObserver
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import (
    MemoryClaims,
    MemoryCounts,
    MemoryJobs,
    MemoryMembers,
    MemoryTriggers,
)
from hrwcron.core import hrw
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import format_ms, manual_claim_key
from hrwcron.engine.ports import (
    HEADER_KIND,
    HEADER_MSG_ID,
    HEADER_RUN,
    Published,
    TriggerWrite,
)
from hrwcron.engine.scheduler import Scheduler, Settings

FAST = Settings(
    node_id="",
    heartbeat_interval=0.2,
    member_ttl=0.8,
    membership_refresh=0.2,
    failover_step=0.4,
    claim_lease=0.5,
    max_clock_skew=1.0,
    shutdown_timeout=1.0,
)
NODES = ["a", "b", "c"]


def now_ms() -> float:
    return time.time() * 1000


def second_after(ms: float, seconds: int = 1) -> int:
    return (int(ms) // 1000 + seconds) * 1000


def rfc3339(ms: float) -> str:
    return format_ms(int(ms))


class CountingJobs(MemoryJobs):
    """The jobs store, counting deletes (a finished job is deleted by one replica)."""

    def __init__(self) -> None:
        super().__init__()
        self.deletes: list[tuple[str, int | None]] = []

    async def delete(self, name: str, last_revision: int | None) -> None:
        self.deletes.append((name, last_revision))
        await super().delete(name, last_revision)


class Cluster:
    def __init__(self) -> None:
        self.members = MemoryMembers(FAST.member_ttl)
        self.claims = MemoryClaims()
        self.triggers = MemoryTriggers()
        self.jobs = CountingJobs()
        self.counts = MemoryCounts()
        self.replicas: dict[str, Scheduler] = {}
        self.recorders: dict[str, RecordingObserver] = {}

    async def start(self, node: str) -> Scheduler:
        recorder = RecordingObserver(node)
        scheduler = Scheduler(
            replace(FAST, node_id=node),
            members=self.members,
            claims=self.claims,
            triggers=self.triggers,
            jobs=self.jobs,
            counts=self.counts,
            observer=recorder,
        )
        await scheduler.start()
        self.replicas[node] = scheduler
        self.recorders[node] = recorder
        return scheduler

    async def start_all(self, nodes: Iterable[str] = NODES) -> None:
        for node in nodes:
            await self.start(node)
        expected = sorted(self.replicas)

        def agreed() -> bool:
            return all(sorted(s.ranking_of("any")) == expected for s in self.replicas.values())

        await wait_for_async(agreed, timeout=10, message=f"every replica sees {expected}")

    async def stop(self, node: str) -> None:
        await self.replicas.pop(node).stop()

    async def stop_all(self) -> None:
        for node in list(self.replicas):
            with contextlib.suppress(Exception):
                await self.stop(node)

    def keys(self, job: str, *, kind: str = "scheduled") -> list[str]:
        return [
            m.headers[HEADER_MSG_ID]
            for m in self.triggers.messages
            if m.subject == f"hrwcron.trigger.{job}" and m.headers.get(HEADER_KIND) == kind
        ]

    def runs(self, job: str) -> list[str]:
        return [
            m.headers.get(HEADER_RUN, "")
            for m in self.triggers.messages
            if m.subject == f"hrwcron.trigger.{job}"
        ]

    def outcomes(self, job: str, outcome: str) -> list[tuple[str, int]]:
        return [
            (node, due)
            for node, recorder in self.recorders.items()
            for decided, due in recorder.of(job)
            if decided == outcome
        ]

    async def wait_keys(self, job: str, count: int, timeout: float = 15) -> None:
        await wait_for_async(
            lambda: len(self.keys(job)) >= count,
            timeout=timeout,
            message=f"{count} triggers of {job}",
        )

    async def wait_past(self, job: str, due_ms: float, timeout: float = 15) -> None:
        """Until ``job`` (an every-second witness) fired a tick due at or after ``due_ms``: time
        that every replica's timer has certainly lived through, observed, not slept."""

        def past() -> bool:
            return any(int(k.rsplit(":", 1)[1]) >= due_ms for k in self.keys(job))

        await wait_for_async(past, timeout=timeout, message=f"{job} past {due_ms:.0f}")


async def stored_total(cluster: Cluster, job: str, total: int) -> bool:
    """Whether the durable run count of ``job`` has reached ``total``."""
    stored = await cluster.counts.get(job)
    return stored is not None and stored.total >= total


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    cluster = Cluster()
    try:
        yield cluster
    finally:
        await cluster.stop_all()


WITNESS = JobSpec(name="witness", schedule="@every 1s")


# --- @at ------------------------------------------------------------------------------------


async def test_one_time_job_fires_once_even_when_its_owner_dies_first(cluster: Cluster) -> None:
    at = second_after(now_ms(), 3)
    job = JobSpec(name="remind", schedule=f"@at {rfc3339(at)}")
    await cluster.jobs.put(job, None)
    await cluster.jobs.put(WITNESS, None)
    await cluster.start_all()
    owner = hrw.rank(job.name, NODES)[0]
    await cluster.stop(owner)  # before the instant: the next candidate fires it
    await cluster.wait_past(WITNESS.name, at + 3000)
    assert cluster.keys(job.name) == [f"remind:{at}"]
    for node, scheduler in cluster.replicas.items():
        assert scheduler.jobs[job.name].due is None, node  # done: nothing left to fire
        assert job.name in scheduler.jobs  # and it stays


async def test_one_time_job_written_after_its_instant_never_fires(cluster: Cluster) -> None:
    """Writing a job never fires an instant from before the write, @at included, even inside
    the lateness window (the admin API refuses such a write; a file applied later may not)."""
    at = int(now_ms()) - 500
    job = JobSpec(name="late", schedule=f"@at {rfc3339(at)}")
    await cluster.jobs.put(job, None)
    await cluster.jobs.put(WITNESS, None)
    await cluster.start_all()
    await cluster.wait_past(WITNESS.name, now_ms() + 2000)
    assert cluster.keys(job.name) == []


async def test_delete_after_removes_a_finished_job_once(cluster: Cluster) -> None:
    at = second_after(now_ms(), 2)
    job = JobSpec(name="cleanup", schedule=f"@at {rfc3339(at)}", delete_after=1.0)
    await cluster.jobs.put(job, None)
    await cluster.start_all()
    await wait_for_async(
        lambda: all("cleanup" not in s.jobs for s in cluster.replicas.values()),
        timeout=15,
        message="the finished job deleted everywhere",
    )
    assert cluster.keys(job.name) == [f"cleanup:{at}"]
    assert await cluster.jobs.get(job.name) is None
    # Owner first, the others a failover step later and only if it is still there: the first
    # delete wins, a second one (if any) is refused by its revision and changes nothing.
    succeeded = [d for d in cluster.jobs.deletes if d[0] == job.name]
    assert 1 <= len(succeeded) <= len(NODES)
    assert await cluster.jobs.last_revision() == 2  # one put, one delete


# --- start and end ----------------------------------------------------------------------------


async def test_window_bounds_the_ticks_both_ends_included(cluster: Cluster) -> None:
    start = second_after(now_ms(), 3)
    end = start + 2000
    job = JobSpec(name="campaign", schedule="@every 1s", start=rfc3339(start), end=rfc3339(end))
    await cluster.jobs.put(job, None)
    await cluster.jobs.put(WITNESS, None)
    await cluster.start_all()
    await cluster.wait_past(WITNESS.name, end + 2000)
    assert cluster.keys(job.name) == [f"campaign:{t}" for t in (start, start + 1000, end)]
    for scheduler in cluster.replicas.values():
        assert scheduler.jobs[job.name].due is None


# --- exclusions -------------------------------------------------------------------------------


async def test_excluded_ticks_never_fire_and_are_counted_once_by_their_owner(
    cluster: Cluster,
) -> None:
    job = JobSpec(name="odd", schedule="@every 1s", exclude=["*/2 * * * * *"])
    await cluster.jobs.put(job, None)
    await cluster.start_all()
    begin = second_after(now_ms(), 1)
    await cluster.wait_keys(job.name, 4)
    end = int(cluster.keys(job.name)[-1].rsplit(":", 1)[1])
    fired = [int(k.rsplit(":", 1)[1]) for k in cluster.keys(job.name)]
    assert all((t // 1000) % 2 == 1 for t in fired), fired
    seconds = range(begin, end + 1, 1000)
    assert [t for t in fired if t >= begin] == [t for t in seconds if (t // 1000) % 2 == 1]
    # Every even second in between was counted once, by its owner, and never published.
    excluded = sorted(
        due for _, due in cluster.outcomes(job.name, "excluded") if begin <= due < end
    )
    assert excluded == [t for t in seconds if (t // 1000) % 2 == 0]
    owner = hrw.rank(job.name, NODES)[0]
    assert {node for node, _ in cluster.outcomes(job.name, "excluded")} == {owner}


# --- max_runs ---------------------------------------------------------------------------------


async def test_max_runs_stops_after_exactly_n_across_a_restart_and_a_forgetful_stream(
    cluster: Cluster,
) -> None:
    job = JobSpec(name="thrice", schedule="@every 1s", max_runs=3)
    await cluster.jobs.put(job, None)
    await cluster.jobs.put(WITNESS, None)
    await cluster.start_all()
    await cluster.wait_keys(job.name, 1)
    await cluster.stop_all()
    # The stream forgets the job's triggers (max_age): only the durable count remembers.
    await wait_for_async(
        lambda: stored_total(cluster, job.name, 1),
        timeout=5,
        message="the durable count written",
    )
    first = cluster.keys(job.name)
    cluster.triggers.forget(f"hrwcron.trigger.{job.name}")
    await cluster.start_all()
    await cluster.wait_keys(job.name, 3 - len(first))
    restarted = cluster.keys(job.name)
    await cluster.wait_past(WITNESS.name, now_ms() + 3000)
    assert cluster.keys(job.name) == restarted
    assert len(first) + len(restarted) == 3
    assert cluster.runs(job.name) == [str(n) for n in range(len(first) + 1, 4)]
    stored = await cluster.counts.get(job.name)
    assert stored is not None and stored.total == 3
    for scheduler in cluster.replicas.values():
        assert scheduler.runs_done(job.name) == 3
        assert scheduler.jobs[job.name].due is None


class BatchWatchingTriggers(MemoryTriggers):
    """The trigger stream, keeping the subjects of every batch of publishes it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def publish_many(self, writes: Sequence[TriggerWrite]) -> list[asyncio.Future[Published]]:
        self.batches.append([subject for subject, _, _, _ in writes])
        return await super().publish_many(writes)


async def test_a_herd_of_max_runs_jobs_numbers_each_job_from_its_own_last_trigger(
    cluster: Cluster,
) -> None:
    """Ticks due together go out as one batch; each trigger's run number still comes from
    its own job's count and newest trigger, and no batch holds two triggers of one job."""
    triggers = cluster.triggers = BatchWatchingTriggers()
    herd = [JobSpec(name=f"herd.{i}", schedule="@every 1s", max_runs=3) for i in range(40)]
    for job in [*herd, WITNESS]:
        await cluster.jobs.put(job, None)
    ahead = herd[1::2]  # one run used before the stream forgot it: only the count knows
    for job in ahead:
        await cluster.counts.raise_total(job.name, 1)
    await cluster.start_all()
    for job in herd:
        await cluster.wait_keys(job.name, 2 if job in ahead else 3)
    await cluster.wait_past(WITNESS.name, now_ms() + 2000)
    for job in herd:
        expected = ["2", "3"] if job in ahead else ["1", "2", "3"]
        assert cluster.runs(job.name) == expected, job.name
    assert all(len(set(batch)) == len(batch) for batch in triggers.batches)
    assert max(len(batch) for batch in triggers.batches) > 1  # the herd did share batches


async def test_manual_triggers_do_not_use_up_runs_and_raising_max_runs_fires_more(
    cluster: Cluster,
) -> None:
    job = JobSpec(name="twice", schedule="@every 1s", max_runs=2)
    await cluster.jobs.put(job, None)
    await cluster.start_all()
    some = next(iter(cluster.replicas.values()))
    await cluster.wait_keys(job.name, 1)
    outcome = await some.publish_unscheduled(
        job.name, "twice:manual:m1", int(now_ms()), "manual", manual_claim_key(job.name, "m1")
    )
    assert outcome == "started"
    await cluster.wait_keys(job.name, 2)
    assert cluster.runs(job.name) == ["1", "1", "2"]  # the manual one carried run 1 forward
    await wait_for_async(
        lambda: all(s.jobs[job.name].due is None for s in cluster.replicas.values()),
        timeout=10,
        message="every replica sees the runs used up",
    )
    event = await cluster.jobs.get(job.name)
    assert event is not None
    await cluster.jobs.put(msgspec.structs.replace(job, max_runs=4), event.revision)
    await cluster.wait_keys(job.name, 4)
    assert cluster.runs(job.name)[-2:] == ["3", "4"]


async def test_deleting_a_job_through_hrwcron_starts_its_count_again(cluster: Cluster) -> None:
    job = JobSpec(name="again", schedule="@every 1s", max_runs=1)
    await cluster.jobs.put(job, None)
    await cluster.start_all()
    await cluster.wait_keys(job.name, 1)
    some = next(iter(cluster.replicas.values()))
    await cluster.jobs.delete(job.name, None)
    await some.reset_runs(job.name, f"hrwcron.trigger.{job.name}")
    await cluster.jobs.put(job, None)
    await cluster.wait_keys(job.name, 2)
    assert cluster.runs(job.name) == ["1", "2"]  # numbers go on; the count started again
    await wait_for_async(
        lambda: stored_total(cluster, job.name, 2),
        timeout=5,
        message="the durable count raised to run 2",
    )
    stored = await cluster.counts.get(job.name)
    assert stored is not None and stored.base == 1


# --- edits ------------------------------------------------------------------------------------


async def test_editing_the_window_never_fires_an_instant_from_before_the_edit(
    cluster: Cluster,
) -> None:
    """A job ends; then its end is moved later. The ticks it did not fire while it was over
    (inside the lateness window by now) stay unfired: the edit counts from when it was made."""
    end = second_after(now_ms(), 2)
    job = JobSpec(name="extended", schedule="@every 1s", end=rfc3339(end), max_lateness=30)
    await cluster.jobs.put(job, None)
    await cluster.jobs.put(WITNESS, None)
    await cluster.start_all()
    await cluster.wait_past(WITNESS.name, end + 2000)
    before = cluster.keys(job.name)
    assert before[-1] == f"extended:{end}"
    event = await cluster.jobs.get(job.name)
    assert event is not None
    edited = now_ms()
    await cluster.jobs.put(msgspec.structs.replace(job, end=rfc3339(end + 60_000)), event.revision)
    await cluster.wait_keys(job.name, len(before) + 2)
    after = [int(k.rsplit(":", 1)[1]) for k in cluster.keys(job.name)[len(before) :]]
    assert min(after) > edited, (after, edited)


def test_outcome_names_are_exported() -> None:
    from hrwcron.adapters.telemetry import OUTCOMES

    assert {"excluded", "max_runs"} <= set(OUTCOMES)
