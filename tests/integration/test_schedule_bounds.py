"""Schedules with a beginning and an end on real nats-server processes: a one-time job, an
active window, a run limit and exclusions, each through the ordinary tick (claim, fenced
publish, tick key ``<job>:<due ms>``).

The two claims that need real processes run ``hrwcron run`` replicas: a one-time job fires
exactly once across three replicas while its owner is SIGKILLed, and ``max_runs = 3`` stops
after exactly three triggers across a restart of every replica, even when the stream has
forgotten the earlier triggers (a subject purge stands in for ``stream_max_age``). The rest use
in-process replicas (tests/integration/replicas.py) on a real server, which is cheaper.

Absence ("nothing more fired") is observed, not slept on: an every-second witness job shows
that the replicas have lived through the instants in question.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness import NatsServer, wait_for_async
from harness.chaos import ReplicaFleet, TriggerLog, now_ms, wait_until_ms
from harness.commands import hrwcron
from harness.inprocess_replicas import Cluster
from hrwcron.admin import AdminClient, AdminError
from hrwcron.core import hrw, partitions
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import format_ms
from hrwcron.engine.ports import HEADER_RUN
from hrwcron.process.app import Stores, open_stores

STREAM = "HRWCRON_TRIGGERS"
NODES = ["r0", "r1", "r2"]
FAILOVER_STEP_MS = 1000
SLACK_MS = 1500  # a claim and a publish on a busy 2-core machine
WITNESS = JobSpec(name="witness", schedule="@every 1s")


def next_second(ms: float, seconds: int = 1) -> int:
    return (int(ms) // 1000 + seconds) * 1000


def rfc3339(ms: float) -> str:
    return format_ms(int(ms))


def subject(job: str) -> str:
    return f"hrwcron.trigger.{job}"


# --- replicas as processes ----------------------------------------------------------------


class Fleet:
    """Three ``hrwcron run`` processes and the test's own stores and trigger log."""

    def __init__(self, fleet: ReplicaFleet, stores: Stores) -> None:
        self.fleet = fleet
        self.stores = stores
        self.log = TriggerLog(stores.client)

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.stores.client, timeout=10.0)

    async def keys(self, job: str) -> list[str]:
        return [r.msg_id for r in await self.stores.triggers.history(subject(job), 1000)]

    async def runs(self, job: str) -> list[str]:
        records = await self.stores.triggers.history(subject(job), 1000)
        return [r.headers.get(HEADER_RUN, "") for r in records]

    async def witness_past(self, instant_ms: float, timeout: float = 60.0) -> None:
        """Until the witness fired a tick due at or after ``instant_ms``."""
        await self.log.wait_covered([WITNESS], instant_ms, timeout)

    def start_all(self) -> None:
        for i in range(len(NODES)):
            self.fleet.start(i, wait=False)
        for i in range(len(NODES)):
            self.fleet.wait_started(i)


@pytest.fixture
async def fleet(
    request: pytest.FixtureRequest, nats_server: NatsServer, tmp_path: Path
) -> AsyncIterator[Fleet]:
    replicas = ReplicaFleet(nats_server.url, len(NODES), tmp_path / "replicas")
    stores = await open_stores(replicas.config())
    found = Fleet(replicas, stores)
    try:
        await stores.jobs.put(WITNESS, None)
        found.start_all()
        await found.witness_past(next_second(now_ms(), 2))
        yield found
    finally:
        replicas.stop_all()
        if getattr(getattr(request.node, "_hrwcron_rep_call", None), "failed", False):
            print(replicas.dump_logs())
        with contextlib.suppress(Exception):
            await stores.client.close()


async def test_one_time_job_fires_exactly_once_across_three_replicas_and_a_kill(
    fleet: Fleet,
) -> None:
    at = next_second(now_ms(), 4)
    job = JobSpec(name="remind.once", schedule=f"@at {rfc3339(at)}")
    await fleet.admin.put_job(job, 0)
    owner = hrw.rank(job.name, NODES)[0]
    victim = NODES.index(owner)
    await wait_until_ms(at - 1500, what="shortly before the one-time instant")
    fleet.fleet.kill(victim)  # the owner dies before its tick: the next candidate fires it
    await fleet.witness_past(at + 4000)
    records = await fleet.stores.triggers.history(subject(job.name), 100)
    assert [r.msg_id for r in records] == [f"{job.name}:{at}"]
    fired = msgspec.json.decode(records[0].body)
    assert fired["node"] != owner and fired["kind"] == "scheduled"
    assert records[0].stored_ms - at <= FAILOVER_STEP_MS + SLACK_MS

    # The victim comes back: nothing fires again, and every replica says the job is done.
    fleet.fleet.start(victim)
    await fleet.witness_past(now_ms() + 3000)
    assert await fleet.keys(job.name) == [f"{job.name}:{at}"]
    status = await fleet.admin.status(job.name)
    assert [(j.state, j.next_due) for j in status.jobs] == [("done", None)]
    assert (await fleet.admin.get_job(job.name)).spec == job  # it stays


async def test_max_runs_stops_after_three_triggers_across_a_restart_and_a_purged_stream(
    fleet: Fleet,
) -> None:
    job = JobSpec(name="migrate.batches", schedule="@every 2s", max_runs=3)
    await fleet.admin.put_job(job, 0)
    await wait_for_async(
        lambda: _has(fleet, job.name, 1), timeout=30, interval=0.1, message="the first run"
    )
    # The durable copy follows the first run at once (the publisher writes it).
    await wait_for_async(
        lambda: _stored_total(fleet, job.name, len_at_least=1),
        timeout=10,
        message="the run count in the counts bucket",
    )
    for i in range(len(NODES)):
        fleet.fleet.kill(i)
    before = await fleet.keys(job.name)
    assert 1 <= len(before) < 3, before
    await wait_for_async(
        lambda: _stored_total(fleet, job.name, len_at_least=len(before)),
        timeout=10,
        message="every run so far in the counts bucket",
    )
    # The stream forgets the job's triggers, as stream_max_age eventually makes it.
    await fleet.stores.client.jetstream().purge_stream(STREAM, subject=subject(job.name))
    assert await fleet.keys(job.name) == []

    fleet.start_all()
    await wait_for_async(
        lambda: _has(fleet, job.name, 3 - len(before)),
        timeout=60,
        interval=0.2,
        message="the remaining runs",
    )
    await fleet.witness_past(now_ms() + 6000)  # three more periods of the job
    after = await fleet.keys(job.name)
    assert len(before) + len(after) == 3, (before, after)
    assert not set(before) & set(after)
    assert await fleet.runs(job.name) == [str(n) for n in range(len(before) + 1, 4)]
    status = await fleet.admin.status(job.name)
    assert [(j.state, j.runs_done, j.runs_left) for j in status.jobs] == [("done", 3, 0)]


async def _has(fleet: Fleet, job: str, count: int) -> bool:
    return len(await fleet.keys(job)) >= count


async def _stored_total(fleet: Fleet, job: str, *, len_at_least: int) -> bool:
    stored = await fleet.stores.counts.get(job)
    return stored is not None and stored.total >= len_at_least


# --- in-process replicas ------------------------------------------------------------------


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}, "c": {}})
    await c.admin.put_job(WITNESS, 0)
    yield c
    await c.stop()


async def witness_past(cluster: Cluster, instant_ms: float) -> None:
    async def past() -> bool:
        keys = await cluster.ticks(WITNESS.name)
        return any(int(k.rsplit(":", 1)[1]) >= instant_ms for k in keys)

    await wait_for_async(past, timeout=30, interval=0.2, message=f"witness past {instant_ms}")


async def test_window_fires_from_start_to_end_both_included(cluster: Cluster) -> None:
    start = next_second(now_ms(), 3)
    end = start + 2000
    job = JobSpec(name="campaign", schedule="@every 1s", start=rfc3339(start), end=rfc3339(end))
    await cluster.admin.put_job(job, 0)
    waiting = await cluster.admin.status(job.name)
    assert [(j.state, j.next_due) for j in waiting.jobs] == [("waiting", rfc3339(start))]
    await witness_past(cluster, end + 2000)
    assert await cluster.ticks(job.name) == [f"campaign:{t}" for t in (start, start + 1000, end)]
    ended = await cluster.admin.status(job.name)
    assert [(j.state, j.next_due) for j in ended.jobs] == [("ended", None)]


async def test_excluded_ticks_are_skipped_and_counted_once_by_the_owner(
    cluster: Cluster,
) -> None:
    job = JobSpec(name="odd.seconds", schedule="@every 1s", exclude=["*/2 * * * * *"])
    await cluster.admin.put_job(job, 0)
    begin = next_second(now_ms(), 2)
    await witness_past(cluster, begin + 6000)
    dues = [int(k.rsplit(":", 1)[1]) for k in await cluster.ticks(job.name)]
    window = range(begin, begin + 6000, 1000)
    assert [t for t in dues if t in window] == [t for t in window if (t // 1000) % 2]
    counted = [
        (node, due)
        for node, recorder in cluster.recorders.items()
        for outcome, due in recorder.of(job.name)
        if outcome == "excluded" and due in window
    ]
    owner = hrw.rank(job.name, ["a", "b", "c"])[0]
    assert sorted(counted) == [(owner, t) for t in window if (t // 1000) % 2 == 0]


async def test_admin_api_refuses_jobs_that_would_never_fire_and_writes_nothing(
    cluster: Cluster,
) -> None:
    past = rfc3339(now_ms() - 60_000)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"schedule": f"@at {past}"}, "spec.schedule", "is not in the future"),
        ({"end": past}, "spec.end", "has passed"),
        (
            {"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"},
            "spec.end",
            "is before start",
        ),
        ({"exclude": ["* * * * *"]}, "spec.exclude", "would never fire"),
        ({"exclude": ["2026-12-31..2026-12-01"]}, "spec.exclude[0]", "runs backwards"),
        ({"max_runs": 0}, "spec.max_runs", "from 1 to"),
    ]
    for fields, where, message in cases:
        spec = JobSpec(**{"name": "never", "schedule": "0 * * * *", **fields})
        with pytest.raises(AdminError) as caught:
            await cluster.admin.put_job(spec, 0)
        assert caught.value.code == "bad_request", fields
        assert caught.value.field == where, (fields, caught.value.message)
        assert message in caught.value.message, caught.value.message
    assert [e.name for e in await cluster.admin.all_jobs()] == [WITNESS.name]


async def test_a_one_time_job_paused_over_its_instant_never_fires_and_delete_after_removes_it(
    cluster: Cluster,
) -> None:
    at = next_second(now_ms(), 3)
    job = JobSpec(name="remind.later", schedule=f"@at {rfc3339(at)}", delete_after=2.0)
    await cluster.admin.put_job(job, 0)
    await cluster.admin.pause(job.name)
    await witness_past(cluster, at + 1000)
    # Resumed inside its lateness window: resuming is an edit, and an edit never fires an
    # instant from before it.
    await cluster.admin.pause(job.name, paused=False)

    async def gone() -> bool:
        return job.name not in [e.name for e in await cluster.admin.all_jobs()]

    await wait_for_async(gone, timeout=20, interval=0.2, message="deleted after delete_after")
    assert await cluster.ticks(job.name) == []


async def test_delete_after_removes_a_fired_one_time_job_once(cluster: Cluster) -> None:
    at = next_second(now_ms(), 3)
    job = JobSpec(name="remind.soon", schedule=f"@at {rfc3339(at)}", delete_after=1.0)
    await cluster.admin.put_job(job, 0)

    async def gone() -> bool:
        return job.name not in [e.name for e in await cluster.admin.all_jobs()]

    await wait_for_async(gone, timeout=20, interval=0.2, message="deleted after delete_after")
    assert await cluster.ticks(job.name) == [f"{job.name}:{at}"]
    # One put and one delete: a second replica's delete was refused by the revision.
    js = cluster.client.jetstream()
    kv = await js.key_value("hrwcron_jobs")
    history = await kv.history(partitions.job_key(job.name, job.tags))
    assert [e.operation for e in history] == [None, "DEL"]


async def test_next_reads_a_jobs_window_and_exclusions_from_the_cluster(
    cluster: Cluster,
) -> None:
    job = JobSpec(
        name="nightly",
        schedule="0 2 * * *",
        tz="Europe/Berlin",
        start="2026-12-20T00:00:00+01:00",
        end="2026-12-31T00:00:00+01:00",
        exclude=["* * 24-26 12 *"],
    )
    await cluster.admin.put_job(job, 0)
    code, out, err = await hrwcron(
        cluster.url, "next", "nightly", "--count", "9", "--after", "2026-12-01T00:00:00Z"
    )
    days = [20, 21, 22, 23, 27, 28, 29, 30]
    assert (code, out.split()) == (0, [f"2026-12-{d}T01:00:00Z" for d in days])
    assert "8 instants: no tick after the end" in err
