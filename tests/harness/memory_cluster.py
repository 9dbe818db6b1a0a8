"""The engine over the in-memory stores: several Scheduler instances in one event loop, sharing
the stores the way replicas share NATS (tests/contract holds those stores to the JetStream
adapters' behaviour). Ticks are real seconds, so replicas run with short heartbeat, TTL,
failover and lease settings (FAST). Tests take the ``cluster`` fixture."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from harness import wait_for_async
from harness.chaos import Trigger, describe, find_violations, parse_trigger
from harness.observers import RecordingObserver
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import (
    MemoryClaims,
    MemoryJobs,
    MemoryMarks,
    MemoryMembers,
    MemoryTriggers,
)
from hrwcron.core.model import ClaimRecord, Heartbeat, JobSpec
from hrwcron.engine.ports import (
    HEADER_JOB,
    HEADER_MSG_ID,
    LastTrigger,
    MemberRecord,
    Published,
)
from hrwcron.engine.scheduler import Scheduler, Settings

MEMBER_TTL = 0.8
FAST = Settings(
    node_id="",
    heartbeat_interval=0.2,
    member_ttl=MEMBER_TTL,
    membership_refresh=0.2,
    failover_step=0.4,
    claim_lease=0.5,
    max_clock_skew=1.0,
    shutdown_timeout=1.0,
)


def now_ms() -> float:
    return time.time() * 1000


def every_second(name: str, **kwargs: Any) -> JobSpec:
    return JobSpec(name=name, schedule="@every 1s", **kwargs)


class FlakyMembers:
    """The shared members store as one replica sees it: ``cut`` makes every call fail, as
    when that replica cannot reach NATS."""

    def __init__(self, inner: MemoryMembers) -> None:
        self.inner = inner
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise ConnectionError("members store unreachable")

    async def register(self, node: str, heartbeat: Heartbeat, wait: float) -> int:
        self._check()
        return await self.inner.register(node, heartbeat, wait)

    async def beat(self, node: str, heartbeat: Heartbeat, last_revision: int) -> int:
        self._check()
        return await self.inner.beat(node, heartbeat, last_revision)

    async def deregister(self, node: str) -> None:
        self._check()
        await self.inner.deregister(node)

    async def snapshot(self) -> dict[str, MemberRecord]:
        self._check()
        return await self.inner.snapshot()

    async def watch(self) -> AsyncIterator[tuple[str, MemberRecord | None]]:
        self._check()
        async for item in self.inner.watch():
            self._check()
            yield item

    async def stored_at(self, revision: int) -> float | None:
        self._check()
        return await self.inner.stored_at(revision)


class HangingClaims:
    """Claims as one replica sees them, where creates for ``hung`` jobs never return: the
    replica is stuck before its claim lands, so the next candidate has to act."""

    def __init__(self, inner: MemoryClaims) -> None:
        self.inner = inner
        self.hung: set[str] = set()
        self.reads: dict[str, int] = {}  # claim key -> how often this replica read it

    async def create(self, key: str, record: ClaimRecord, ttl: float) -> int | None:
        if key.rsplit(".", 2)[0] in self.hung:  # <job>.<kind>.<value>
            await asyncio.Event().wait()
        return await self.inner.create(key, record, ttl)

    async def create_many(
        self, writes: Sequence[tuple[str, ClaimRecord, float]]
    ) -> list[asyncio.Future[int | None]]:
        # One answer each, as a real batch gives: a hung create holds up no other.
        return [asyncio.ensure_future(self.create(*write)) for write in writes]

    async def get(self, key: str) -> tuple[ClaimRecord, int] | None:
        self.reads[key] = self.reads.get(key, 0) + 1
        return await self.inner.get(key)

    async def replace(
        self, key: str, record: ClaimRecord, last_revision: int, ttl: float
    ) -> int | None:
        return await self.inner.replace(key, record, last_revision, ttl)

    async def release(self, key: str, last_revision: int) -> bool:
        return await self.inner.release(key, last_revision)


class GatedTriggers:
    """The trigger stream as one replica sees it, where the first publish of each ``held`` job
    waits for ``gate``: the replica froze after claiming and before publishing, and wakes up
    when the test opens the gate, with the expectation it had computed before freezing."""

    def __init__(self, inner: MemoryTriggers) -> None:
        self.inner = inner
        self.held: set[str] = set()
        self.frozen: dict[str, int] = {}  # job -> the due it froze on
        self.gate = asyncio.Event()
        self.follows = 0  # how often this replica read the whole stream
        self.read: list[str] = []  # the subjects it read the newest trigger of, in order
        self.read_one: list[str] = []  # the subjects it read one at a time (a fenced publish)

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        job = headers.get(HEADER_JOB, "")
        if job in self.held:
            self.held.discard(job)
            self.frozen[job] = int(headers[HEADER_MSG_ID].rsplit(":", 1)[1])
            await self.gate.wait()
        return await self.inner.publish(subject, body, headers, expected_last_seq)

    async def publish_many(
        self, writes: Sequence[tuple[str, bytes, dict[str, str], int]]
    ) -> list[asyncio.Future[Published]]:
        return [asyncio.ensure_future(self.publish(*write)) for write in writes]

    async def last(self, subject: str) -> LastTrigger | None:
        self.read_one.append(subject)
        return await self.inner.last(subject)

    async def last_many(self, subjects: Sequence[str]) -> dict[str, LastTrigger]:
        self.read.extend(subjects)
        return await self.inner.last_many(subjects)

    def follow(self) -> AsyncIterator[tuple[str, LastTrigger] | None]:
        self.follows += 1
        return self.inner.follow()


@dataclass
class Replica:
    scheduler: Scheduler
    members: FlakyMembers
    claims: HangingClaims
    triggers: GatedTriggers
    recorder: RecordingObserver


class Cluster:
    """Stores shared by every replica started on it, as one NATS account is."""

    def __init__(self, duplicate_window: float = 600.0) -> None:
        self.members = MemoryMembers(MEMBER_TTL)
        self.claims = MemoryClaims()
        self.triggers = MemoryTriggers(duplicate_window)
        self.jobs = MemoryJobs()
        self.marks = MemoryMarks()
        self.replicas: dict[str, Replica] = {}

    async def start(
        self, node: str, jobs: Any = None, *, marks: bool = True, **settings: Any
    ) -> Replica:
        """Start a replica on the shared stores; ``jobs`` replaces its view of the jobs bucket;
        ``marks=False`` runs it as versions before progress marks did (following the stream)."""
        members = FlakyMembers(self.members)
        claims = HangingClaims(self.claims)
        triggers = GatedTriggers(self.triggers)
        recorder = RecordingObserver(node)
        scheduler = Scheduler(
            replace(FAST, node_id=node, **settings),
            members=members,
            claims=claims,
            triggers=triggers,
            jobs=self.jobs if jobs is None else jobs,
            marks=self.marks if marks else None,
            observer=recorder,
        )
        await scheduler.start()
        replica = Replica(scheduler, members, claims, triggers, recorder)
        self.replicas[node] = replica
        return replica

    async def start_all(self, nodes: Iterable[str]) -> list[Replica]:
        started = [await self.start(node) for node in nodes]
        expected = sorted(self.replicas)

        def agreed() -> bool:
            return all(
                [c.node for c in r.scheduler._candidates] == expected
                for r in self.replicas.values()
            )

        await wait_for_async(agreed, timeout=10, message=f"every replica sees {expected}")
        return started

    async def stop(self, node: str) -> None:
        await self.replicas.pop(node).scheduler.stop()

    async def stop_all(self) -> None:
        for node in list(self.replicas):
            with contextlib.suppress(Exception):
                await self.stop(node)

    async def put(self, *specs: JobSpec) -> float:
        """Store jobs; returns a time at or after their write."""
        for spec in specs:
            await self.jobs.put(spec, None)
        return now_ms()

    def triggers_log(self) -> list[Trigger]:
        return [
            parse_trigger(m.seq, m.subject, m.body, m.headers, m.stored_ms)
            for m in self.triggers.messages
        ]

    def of(self, job: str) -> list[Trigger]:
        return [t for t in self.triggers_log() if t.job == job and t.scheduled]

    async def run_until(self, jobs: Iterable[JobSpec], due_ms: float, timeout: float = 15) -> None:
        """Wait until every job has fired its tick due at ``due_ms`` (or later)."""
        names = [j.name for j in jobs]

        def covered() -> bool:
            newest: dict[str, int] = {}
            for t in self.triggers_log():
                if t.scheduled:
                    newest[t.job] = max(newest.get(t.job, 0), t.due_ms)
            return all(newest.get(n, 0) >= due_ms for n in names)

        await wait_for_async(covered, timeout=timeout, message=f"ticks due by {due_ms:.0f}")

    def violations(self, jobs: Iterable[JobSpec], window: tuple[float, float]) -> str:
        return describe(find_violations(self.triggers_log(), jobs, window))


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    cluster = Cluster()
    try:
        yield cluster
    finally:
        await cluster.stop_all()


def second_after(ms: float, seconds: int = 1) -> int:
    return (int(ms) // 1000 + seconds) * 1000
