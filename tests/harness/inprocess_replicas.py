"""In-process replicas on a real nats-server, for admin API and worker tests.

Each replica has its own NATS connection and runs the real engine, JetStream adapters and
admin service, exactly as ``hrwcron run`` composes them; only the process boundary is gone,
which keeps these tests cheap on a small machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import nats
from nats.aio.client import Client

from harness import wait_for_async
from harness.observers import RecordingObserver
from harness.timings import QUICK, Timings
from hrwcron.adapters.jetstream.jobs import JetStreamJobs
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.adapters.jetstream.triggers import JetStreamTriggers
from hrwcron.admin import AdminClient
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import TriggerMessage
from hrwcron.core.ticks import TickId
from hrwcron.engine.ports import TriggerRecord
from hrwcron.process.app import Replica, start_replica


def replica_config(url: str, node: str, *, timings: Timings = QUICK, **scheduler: Any) -> Config:
    """A replica's configuration: ``timings`` (quick unless given), then ``scheduler``
    settings, which may override them."""
    return Config(
        nats=NatsConfig(servers=[url]),
        scheduler=SchedulerConfig(node_id=node, **{**timings.settings(), **scheduler}),
        http=HttpConfig(listen=""),
    )


class Cluster:
    def __init__(self, url: str) -> None:
        self.url = url
        self.replicas: dict[str, Replica] = {}
        self.recorders: dict[str, RecordingObserver] = {}
        self.nc: Client | None = None

    @classmethod
    async def start(cls, url: str, nodes: dict[str, dict[str, Any]]) -> Cluster:
        cluster = cls(url)
        try:
            for node, options in nodes.items():
                await cluster.add(node, **options)
            cluster.nc = await nats.connect(url)
            await cluster.wait_formed()
        except BaseException:
            await cluster.stop()
            raise
        return cluster

    async def wait_formed(self, timeout: float = 30.0) -> None:
        """Until every replica counts every other as a live, ready candidate: before that,
        a replica whose clock offset is still unknown is rightly left out of every ranking."""
        everyone = sorted(self.replicas)

        def formed() -> bool:
            return all(
                sorted(r.scheduler.ranking_of("any-job")) == everyone
                for r in self.replicas.values()
            )

        await wait_for_async(formed, timeout=timeout, message=f"members {everyone} all ready")

    async def add(self, node: str, **options: Any) -> Replica:
        recorder = RecordingObserver(node)
        replica = await start_replica(replica_config(self.url, node, **options), {}, recorder)
        self.replicas[node] = replica
        self.recorders[node] = recorder
        return replica

    async def stop(self) -> None:
        for replica in self.replicas.values():
            await replica.stop()
        self.replicas.clear()
        if self.nc is not None:
            await self.nc.close()

    @property
    def client(self) -> Client:
        assert self.nc is not None
        return self.nc

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.client, timeout=10.0)

    @property
    def triggers(self) -> JetStreamTriggers:
        return JetStreamTriggers(
            self.client.jetstream(),
            "HRWCRON_TRIGGERS",
            "hrwcron.trigger",
            JetStreamPipeline(self.client),
        )

    async def jobs_store(self) -> JetStreamJobs:
        js = self.client.jetstream()
        return JetStreamJobs(js, await js.key_value("hrwcron_jobs"), "hrwcron_jobs")

    async def stored(self, job: str, subject: str | None = None) -> list[TriggerRecord]:
        """Every trigger the stream holds for ``job``, oldest first."""
        return await self.triggers.history(subject or f"hrwcron.trigger.{job}", 10_000)

    async def ticks(self, job: str) -> list[str]:
        return [r.msg_id for r in await self.stored(job)]

    def outcomes(self, job: str, outcome: str) -> int:
        return sum(r.count(job, outcome) for r in self.recorders.values())


def bodies(records: Iterable[TriggerRecord]) -> list[TriggerMessage]:
    return [msgspec.json.decode(r.body, type=TriggerMessage) for r in records]


def scheduled_dues(keys: Iterable[str]) -> list[int]:
    """Due instants of the scheduled tick keys among ``keys`` (manual keys left out)."""
    dues = []
    for key in keys:
        try:
            dues.append(TickId.parse(key).due_ms)
        except ValueError:
            continue
    return dues
