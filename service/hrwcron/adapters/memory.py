"""In-memory stores with the same contract as the JetStream adapters, for engine unit tests.

The contract tests in tests/contract run against both, so behaviour the engine relies on
(create-only claims, compare-and-set, Msg-Id deduplication, subject-sequence fencing,
watch streams) is the same here and on a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hrwcron.adapters.memory_triggers import MemoryTriggers, StoredTrigger, answered, is_scheduled
from hrwcron.core import partitions
from hrwcron.core.errors import ConflictError, DuplicateNodeError, SubjectTakenError
from hrwcron.core.model import ClaimRecord, Heartbeat, JobSpec
from hrwcron.core.resources import SUBJECT_PREFIX
from hrwcron.core.run_limits import RunCount
from hrwcron.engine.marks import Mark
from hrwcron.engine.ports import (
    ClaimWrite,
    Covered,
    JobEvent,
    MemberRecord,
)

__all__ = [
    "MemoryClaims",
    "MemoryCounts",
    "MemoryJobs",
    "MemoryMarks",
    "MemoryMembers",
    "MemoryRuns",
    "MemoryTriggers",
    "StoredTrigger",
    "is_scheduled",
]

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    value: T
    revision: int
    expires: float | None
    written_ms: float = field(default_factory=lambda: time.time() * 1000)


@dataclass
class _Bucket(Generic[T]):
    """A tiny KV bucket: revisions from one counter, optional expiry, change listeners."""

    now: Callable[[], float]
    entries: dict[str, _Entry[T]] = field(default_factory=dict)
    revision: int = 0
    listeners: list[asyncio.Queue[tuple[str, T | None, int]]] = field(default_factory=list)

    def live(self, key: str) -> _Entry[T] | None:
        entry = self.entries.get(key)
        if entry is not None and entry.expires is not None and entry.expires <= self.now():
            del self.entries[key]
            return None
        return entry

    def write(self, key: str, value: T | None, ttl: float | None) -> int:
        self.revision += 1
        if value is None:
            self.entries.pop(key, None)
        else:
            expires = self.now() + ttl if ttl else None
            self.entries[key] = _Entry(value, self.revision, expires)
        for queue in self.listeners:
            queue.put_nowait((key, value, self.revision))
        return self.revision

    def create(self, key: str, value: T, ttl: float | None = None) -> int | None:
        if self.live(key) is not None:
            return None
        return self.write(key, value, ttl)

    def update(self, key: str, value: T, last: int, ttl: float | None = None) -> int | None:
        entry = self.live(key)
        if entry is None or entry.revision != last:
            return None
        return self.write(key, value, ttl)

    def items(self) -> dict[str, _Entry[T]]:
        return {k: e for k in list(self.entries) if (e := self.live(k)) is not None}

    def subscribe(self) -> asyncio.Queue[tuple[str, T | None, int]]:
        """Registered at once, so nothing written after this call is missed."""
        queue: asyncio.Queue[tuple[str, T | None, int]] = asyncio.Queue()
        self.listeners.append(queue)
        return queue

    async def changes(
        self, queue: asyncio.Queue[tuple[str, T | None, int]] | None = None
    ) -> AsyncIterator[tuple[str, T | None, int]]:
        queue = queue or self.subscribe()
        try:
            while True:
                yield await queue.get()
        finally:
            self.listeners.remove(queue)


class MemoryMembers:
    def __init__(
        self,
        ttl: float,
        now: Callable[[], float] = lambda: time.monotonic(),
        server_clock: Callable[[], float] = lambda: time.time() * 1000,
    ) -> None:
        self.ttl = ttl
        self.server_clock = server_clock
        self._bucket: _Bucket[Heartbeat] = _Bucket(now)

    async def register(self, node: str, heartbeat: Heartbeat, wait: float) -> int:
        revision = self._bucket.create(node, heartbeat, self.ttl)
        if revision is None:
            other = self._bucket.live(node)
            started = other.value.started_ms if other else 0
            raise DuplicateNodeError(f"node id {node!r} is already live (started at {started} ms)")
        return revision

    async def beat(self, node: str, heartbeat: Heartbeat, last_revision: int) -> int:
        revision = self._bucket.update(node, heartbeat, last_revision, self.ttl)
        if revision is None:
            held = self._bucket.live(node)
            if held is None:
                return self._bucket.write(node, heartbeat, self.ttl)
            if held.value.instance == heartbeat.instance:
                return held.revision  # our previous beat landed but its answer was lost
            raise ConflictError(f"member key {node!r} was written by another replica")
        return revision

    async def deregister(self, node: str) -> None:
        self._bucket.write(node, None, None)

    async def snapshot(self) -> dict[str, MemberRecord]:
        return {k: MemberRecord(e.value, e.revision) for k, e in self._bucket.items().items()}

    async def watch(self) -> AsyncIterator[tuple[str, MemberRecord | None]]:
        """The current members, then every change (as a KV watch on the server does)."""
        changes = self._bucket.changes(self._bucket.subscribe())
        for node, record in (await self.snapshot()).items():
            yield node, record
        async for key, value, revision in changes:
            yield key, (MemberRecord(value, revision) if value is not None else None)

    async def stored_at(self, revision: int) -> float | None:
        return self.server_clock()


class MemoryClaims:
    def __init__(self, now: Callable[[], float] = lambda: time.monotonic()) -> None:
        self._bucket: _Bucket[ClaimRecord] = _Bucket(now)

    async def create(self, key: str, record: ClaimRecord, ttl: float) -> int | None:
        return self._bucket.create(key, record, ttl)

    async def create_many(self, writes: Sequence[ClaimWrite]) -> list[asyncio.Future[int | None]]:
        return [answered(self._bucket.create(key, record, ttl)) for key, record, ttl in writes]

    async def get(self, key: str) -> tuple[ClaimRecord, int] | None:
        entry = self._bucket.live(key)
        return (entry.value, entry.revision) if entry else None

    async def replace(
        self, key: str, record: ClaimRecord, last_revision: int, ttl: float
    ) -> int | None:
        return self._bucket.update(key, record, last_revision, ttl)

    async def release(self, key: str, last_revision: int) -> bool:
        entry = self._bucket.live(key)
        if entry is None or entry.revision != last_revision:
            return False
        self._bucket.write(key, None, None)
        return True


class MemoryJobs:
    """Job specs under the keys the JetStream store uses (``p=<lane>.<name>``): a tag change
    moves a job between lanes, seen by a watch as a delete in one and a write in the other."""

    def __init__(self, subject_prefix: str = SUBJECT_PREFIX) -> None:
        self._bucket: _Bucket[JobSpec] = _Bucket(time.monotonic)
        self._prefix = subject_prefix
        self._keys: dict[str, str] = {}  # job name -> its key

    def _event(self, key: str, entry: _Entry[JobSpec]) -> JobEvent:
        _, name = partitions.split_key(key)
        return JobEvent(name, entry.value, entry.revision, written_ms=entry.written_ms, key=key)

    async def snapshot(self) -> dict[str, JobEvent]:
        return {
            partitions.split_key(k)[1]: self._event(k, e) for k, e in self._bucket.items().items()
        }

    async def get(self, name: str) -> JobEvent | None:
        key = self._keys.get(name, "")
        entry = self._bucket.live(key)
        return self._event(key, entry) if entry else None

    async def put(self, spec: JobSpec, last_revision: int | None) -> int:
        # One event loop writes here, so checking every job is as good as a subject claim.
        subject = spec.trigger_subject(self._prefix)
        for key, entry in self._bucket.items().items():
            name = partitions.split_key(key)[1]
            if name != spec.name and entry.value.trigger_subject(self._prefix) == subject:
                raise SubjectTakenError(subject, name)
        old_key = self._keys.get(spec.name)
        current = self._bucket.live(old_key) if old_key is not None else None
        if last_revision == 0 and current is not None:
            raise ConflictError(f"job {spec.name!r} already exists")
        if last_revision and (current is None or current.revision != last_revision):
            raise ConflictError(f"job {spec.name!r} changed since revision {last_revision}")
        key = partitions.job_key(spec.name, spec.tags)
        if old_key is not None and old_key != key and current is not None:
            self._bucket.write(old_key, None, None)
        self._keys[spec.name] = key
        return self._bucket.write(key, spec, None)

    async def put_many(self, items: Sequence[tuple[JobSpec, int | None]]) -> list[int | Exception]:
        results: list[int | Exception] = []
        for spec, revision in items:
            try:
                results.append(await self.put(spec, revision))
            except Exception as exc:
                results.append(exc)
        return results

    async def delete_many(self, items: Sequence[tuple[str, int | None]]) -> list[Exception | None]:
        results: list[Exception | None] = []
        for name, revision in items:
            try:
                await self.delete(name, revision)
                results.append(None)
            except Exception as exc:
                results.append(exc)
        return results

    async def delete(self, name: str, last_revision: int | None) -> None:
        key = self._keys.get(name, "")
        entry = self._bucket.live(key)
        if last_revision is not None and (entry is None or entry.revision != last_revision):
            raise ConflictError(f"job {name!r} changed since revision {last_revision}")
        self._bucket.write(key or name, None, None)

    async def last_revision(self) -> int:
        return self._bucket.revision

    def nudge(self) -> None:
        """Its watches say how far they have got after every change already."""

    async def watch(
        self, lanes: Collection[str] | None = None
    ) -> AsyncIterator[JobEvent | Covered | None]:
        def wanted(key: str) -> bool:
            return lanes is None or partitions.split_key(key)[0] in lanes

        changes = self._bucket.changes(self._bucket.subscribe())
        covered = self._bucket.revision
        for key, entry in self._bucket.items().items():
            if wanted(key):
                yield self._event(key, entry)
        yield None
        yield Covered(covered)
        async for key, value, revision in changes:
            if wanted(key):
                _, name = partitions.split_key(key)
                yield JobEvent(name, value, revision, written_ms=time.time() * 1000, key=key)
            yield Covered(revision)


class MemoryMarks:
    """Marks fanned out to every follower, as core NATS delivers them: in order, unstored."""

    def __init__(self) -> None:
        self._followers: list[asyncio.Queue[Mark]] = []

    async def announce(self, mark: Mark) -> None:
        for queue in self._followers:
            queue.put_nowait(mark)

    async def follow(self) -> AsyncIterator[Mark]:
        queue: asyncio.Queue[Mark] = asyncio.Queue()
        self._followers.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._followers.remove(queue)


class MemoryRuns:
    def __init__(self) -> None:
        self.active: set[str] = set()

    async def running(self, job: str) -> bool:
        return job in self.active


class MemoryCounts:
    """The durable run counts: a bucket of RunCount records changed only by compare-and-set."""

    def __init__(self) -> None:
        self._bucket: _Bucket[RunCount] = _Bucket(time.monotonic)

    async def get(self, job: str) -> RunCount | None:
        entry = self._bucket.live(job)
        return entry.value if entry else None

    async def raise_total(self, job: str, total: int) -> RunCount:
        return self._change(
            job, lambda held: RunCount(total=max(total, held.total), base=held.base)
        )

    async def reset(self, job: str, total: int) -> RunCount:
        def reset(held: RunCount) -> RunCount:
            top = max(total, held.total)
            return RunCount(total=top, base=top)

        return self._change(job, reset)

    def _change(self, job: str, change: Callable[[RunCount], RunCount]) -> RunCount:
        entry = self._bucket.live(job)
        held = entry.value if entry else RunCount()
        wanted = change(held)
        if wanted == held and entry is not None:
            return held
        if entry is None:
            self._bucket.create(job, wanted)
        else:
            self._bucket.update(job, wanted, entry.revision)
        return wanted
