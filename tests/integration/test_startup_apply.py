"""Replicas started at the same moment from one configuration file, as a Kubernetes Deployment
or the compose file starts them: each writes the file's ``[[jobs]]`` at start-up, and losing
that race to another replica must never stop one from starting.

Replicas run in-process (one connection each, the real start-up path of ``hrwcron run``): five
process start-ups per round would spend the time on imports rather than on the race.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats
import pytest

from harness import NatsServer, wait_for_async
from harness.inprocess_replicas import replica_config
from hrwcron.adapters.jetstream.jobs import JetStreamJobs
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.core.config import Config
from hrwcron.core.model import JobSpec, encode
from hrwcron.engine.jobsync import apply_at_start
from hrwcron.engine.ports import NullObserver
from hrwcron.process.app import Replica, start_replica

REPLICAS = 5
ROUNDS = 20
JOBS = [JobSpec(name=f"herd.j{i:03d}", schedule=f"{i % 60} * * * *") for i in range(200)]


def file_config(url: str, node: str) -> Config:
    # Quick heartbeats (the harness's default) make a round's replicas ready within a second.
    return msgspec.structs.replace(replica_config(url, node), jobs=list(JOBS))


async def test_replicas_started_together_from_one_file_all_become_ready(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hrwcron.app")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    raced = 0
    try:
        jobs: JetStreamJobs | None = None
        for round_ in range(ROUNDS):
            nodes = [f"r{round_}-{i}" for i in range(REPLICAS)]
            mark = len(caplog.records)
            results = await asyncio.gather(
                *(
                    start_replica(file_config(nats_server.url, n), {}, NullObserver())
                    for n in nodes
                ),
                return_exceptions=True,
            )
            started = [r for r in results if isinstance(r, Replica)]
            try:
                failed = [
                    f"{n}: {r!r}" for n, r in zip(nodes, results, strict=True) if r not in started
                ]
                assert not failed, f"round {round_}: replicas failed to start: {failed}"
                if jobs is None:  # the first round's replicas created the bucket
                    jobs = JetStreamJobs(js, await js.key_value("hrwcron_jobs"), "hrwcron_jobs")
                await wait_for_async(
                    lambda started=started: all(r.scheduler.ready for r in started),
                    timeout=30,
                    message=f"round {round_}: every replica ready",
                )
                # Read key by key: a watch-based snapshot can come back empty under load.
                for spec in JOBS:
                    entry = await jobs.get(spec.name)
                    assert entry is not None and entry.spec is not None, spec.name
                    assert encode(entry.spec) == encode(spec)
                for replica in started:
                    assert sorted(replica.scheduler.jobs) == sorted(s.name for s in JOBS)
            finally:
                for replica in started:
                    await replica.stop()
            records = caplog.records[mark:]
            assert not [r for r in records if r.levelno >= logging.WARNING], [
                r.getMessage() for r in records if r.levelno >= logging.WARNING
            ]
            raced += sum("written by another replica" in r.getMessage() for r in records)
            # Every round starts from an empty jobs bucket, so every replica has creates to race.
            await js.purge_stream("KV_hrwcron_jobs")
    finally:
        await nc.close()
    # Without this the test could pass on rounds in which one replica wrote everything before
    # the others read the bucket, proving nothing about the race.
    assert raced > 0, "no replica ever lost a write race: the test did not exercise it"


class RacingJobs(MemoryJobs):
    """A jobs store in which another writer stores ``theirs`` just before each of our writes
    to a job in ``contested``, as a replica started from a different file would."""

    def __init__(self, theirs: dict[str, list[JobSpec]]) -> None:
        super().__init__()
        self.theirs = theirs

    async def put(self, spec: JobSpec, last_revision: int | None) -> int:
        queue = self.theirs.get(spec.name)
        if queue:
            await super().put(queue.pop(0), None)
        return await super().put(spec, last_revision)


async def test_a_different_spec_written_meanwhile_is_replaced_once_then_left_with_a_warning() -> (
    None
):
    ours = JobSpec(name="a", schedule="@every 1m")
    other = JobSpec(name="a", schedule="@every 5m")
    same = JobSpec(name="b", schedule="@every 1m")

    # One concurrent write of a different spec: re-read and re-applied.
    store = RacingJobs({"a": [other], "b": [same]})
    applied = await apply_at_start(store, [ours, same])
    assert encode((await store.get("a")).spec) == encode(ours)  # type: ignore[union-attr]
    assert applied.written == ["+ a (@every 1m)"]
    assert applied.concurrent == ["b"] and applied.left == []

    # Another writer keeps storing its spec: left as stored, with a warning naming the job.
    store = RacingJobs({"a": [other, other]})
    applied = await apply_at_start(store, [ours])
    assert encode((await store.get("a")).spec) == encode(other)  # type: ignore[union-attr]
    assert applied.written == [] and applied.concurrent == []
    assert len(applied.left) == 1 and "'a'" in applied.left[0]

    # Nothing to do when the bucket already holds the file's jobs.
    assert await apply_at_start(store, [other]) == type(applied)()
