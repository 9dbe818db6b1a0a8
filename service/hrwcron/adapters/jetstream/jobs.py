"""The jobs bucket on JetStream: job specs, each write holding a claim on its trigger subject."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import (
    conditional_delete,
    conditional_put,
    conditional_writes,
    create_only,
    deleted,
    last_message,
    snapshot,
    watch_subjects,
)
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.core import partitions
from hrwcron.core.errors import ConflictError, SubjectTakenError
from hrwcron.core.model import (
    JobSpec,
    decode_job,
    encode,
)
from hrwcron.core.resources import SUBJECT_PREFIX
from hrwcron.engine.ports import Covered, JobEvent, StoreUnavailable

# Subject claims live in the claims bucket under keys that no tick claim can have: a claim key
# starts with a job name, whose tokens never hold '='.
SUBJECT_CLAIM = "=subject."
# How long a watch waits for the server to set up one of its consumers: a watch of some
# lanes of a million-job bucket takes the server seconds, longer than a request's 5 s when
# replicas start together, and a setup given up on is work the server did for nothing.
WATCH_SETUP_S = 30.0
# How long the layout marker of a new bucket is tried while the bucket elects its leader.
MARK_WAIT_S = 15.0
# Compare-and-set rounds a job write may lose to concurrent writers before it gives up.
WRITE_ATTEMPTS = 8
# Job writes of one batch that take the full path (reads, claim, job) at the same time.
WRITE_IN_FLIGHT = 256


class SubjectClaim(msgspec.Struct, kw_only=True):
    """The value of a subject claim: the job that publishes on the subject."""

    job: str
    v: int = 1


@dataclass(frozen=True)
class _Stored:
    """A job as the bucket holds it: its newest live key (empty when it has none), that key's
    revision (0 for none), value and spec (when the value is a valid one), the revision of
    every key the job may be under (deletions included), and every live key of it (more than
    one only after a move between keys that did not finish)."""

    key: str
    revision: int
    data: bytes | None
    spec: JobSpec | None
    revisions: dict[str, int]
    live_keys: tuple[tuple[str, int], ...]

    @property
    def live(self) -> bool:
        return self.data is not None


class JetStreamJobs:
    """Job specs in the jobs bucket, each under ``p=<lane>.<name>`` (core/partitions.py) when
    the bucket has lanes, else under its name. With ``claims_bucket`` every write also holds a
    create-only claim on the job's trigger subject (key ``=subject.<subject>`` in that bucket),
    so two jobs can never be written with one subject, whichever replicas write them.

    The claim is written before the job, both compare-and-set. A claim whose job does not
    use its subject (left by a crash between the two writes, or by a job that moved on) is
    taken over: first the holder's key is rewritten compare-and-set, so a write of the holder
    still in flight (it read that revision) fails instead of landing on a subject it no
    longer holds, then the claim itself is replaced compare-and-set.

    A job whose key changes (its tags came or went, or it was written before lanes) moves:
    the new key is written compare-and-set, then the old one deleted compare-and-set; if the
    old one changed meanwhile the new one is deleted again and the write fails as a conflict.
    Readers take a job's newest live key, so a move cut short by a crash reads as the newer
    spec, and the next write of the job removes the older key."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: KeyValue,
        bucket: str,
        *,
        claims_bucket: str | None = None,
        subject_prefix: str = SUBJECT_PREFIX,
        pipeline: JetStreamPipeline | None = None,
        lanes: bool = True,
        covered_every: float = 5.0,
        watch_js: JetStreamContext | None = None,
    ) -> None:
        """``watch_js``: the context the watches set up their consumers through, with a
        longer timeout than a request's (WATCH_SETUP_S)."""
        self._js = js
        self._watch_js = watch_js or js
        self._kv = kv
        self._bucket = bucket
        self._claims = claims_bucket
        self._prefix = subject_prefix
        self._pipeline = pipeline
        self.lanes = lanes
        self._covered_every = covered_every  # how often a watch says how far it has got
        self._nudge = asyncio.Event()

    def _key(self, spec: JobSpec) -> str:
        return partitions.job_key(spec.name, spec.tags) if self.lanes else spec.name

    @staticmethod
    def _event(entry: KeyValue.Entry) -> JobEvent:
        _, name = partitions.split_key(entry.key)
        revision = int(entry.revision or 0)
        created: Any = entry.created
        written = created.timestamp() * 1000 if hasattr(created, "timestamp") else 0.0
        if deleted(entry):
            return JobEvent(name, None, revision, written_ms=written, key=entry.key)
        try:
            spec = decode_job(entry.value or b"", where=entry.key)
        except Exception as exc:
            return JobEvent(name, None, revision, error=str(exc), written_ms=written, key=entry.key)
        return JobEvent(name, spec, revision, written_ms=written, key=entry.key)

    async def snapshot(self) -> dict[str, JobEvent]:
        found: dict[str, JobEvent] = {}
        for entry in await snapshot(self._js, self._bucket):
            if entry.key == partitions.LAYOUT_KEY:
                continue
            event = self._event(entry)
            known = found.get(event.name)
            if known is None or known.revision < event.revision:
                found[event.name] = event
        return found

    async def get(self, name: str) -> JobEvent | None:
        stored = await self._stored(name)
        if stored.data is None:
            return None
        if stored.spec is None:
            try:
                decode_job(stored.data, where=stored.key)
            except Exception as exc:
                return JobEvent(name, None, stored.revision, error=str(exc), key=stored.key)
        return JobEvent(name, stored.spec, stored.revision, key=stored.key)

    async def put(self, spec: JobSpec, last_revision: int | None) -> int:
        return await self._write(spec, last_revision, self._claims)

    async def put_many(
        self, items: Sequence[tuple[JobSpec, int | None]], *, in_flight: int = WRITE_IN_FLIGHT
    ) -> list[int | Exception]:
        """Write every ``(spec, last_revision)`` as :meth:`put` would, many at once; the
        answer per item is its new revision or the error ``put`` would have raised.

        A create (``last_revision`` 0) first tries the two create-only writes of a job that
        never existed, pipelined: every subject claim, then every job whose claim went
        through. Whatever that leaves over (a delete marker, an existing job or claim, an
        update) takes ``put``'s own path, ``in_flight`` at a time."""
        results: list[int | Exception | None] = [None] * len(items)
        if self._claims is not None and self._pipeline is not None:
            creates = [i for i, (_, revision) in enumerate(items) if revision == 0]
            await self._create_new(items, creates, results, self._pipeline, self._claims)
        slots = asyncio.Semaphore(in_flight)

        async def one(index: int) -> None:
            spec, revision = items[index]
            async with slots:
                try:
                    results[index] = await self.put(spec, revision)
                except Exception as exc:
                    results[index] = exc

        await asyncio.gather(*(one(i) for i, r in enumerate(results) if r is None))
        return [r if r is not None else StoreUnavailable("not written") for r in results]

    async def _create_new(
        self,
        items: Sequence[tuple[JobSpec, int | None]],
        creates: list[int],
        results: list[int | Exception | None],
        pipeline: JetStreamPipeline,
        claims: str,
    ) -> None:
        """The fast path of :meth:`put_many` for jobs that never existed. A claim written
        here whose job then cannot be created (it exists after all) is a stale claim, taken
        over like one left by a crash between the two writes."""
        if not creates:
            return
        await self._learn_lanes()
        claim_writes = [
            (
                f"$KV.{claims}.{SUBJECT_CLAIM}{items[i][0].trigger_subject(self._prefix)}",
                encode(SubjectClaim(job=items[i][0].name)),
                0,
            )
            for i in creates
        ]
        claimed = await conditional_writes(pipeline, claim_writes)
        holding: list[int] = []
        for index, answer in zip(creates, claimed, strict=True):
            if isinstance(answer, Exception):
                results[index] = answer  # perhaps written: the caller retries knowingly
            elif answer is not None:
                holding.append(index)
        job_writes = [
            (f"$KV.{self._bucket}.{self._key(items[i][0])}", encode(items[i][0]), 0)
            for i in holding
        ]
        written = await conditional_writes(pipeline, job_writes)
        for index, answer in zip(holding, written, strict=True):
            if answer is not None:
                results[index] = answer

    def _keys_of(self, name: str) -> tuple[str, ...]:
        """Every key the job may be under: its lane, the tagged lane, and its bare name (as
        versions before lanes wrote it, or a write around hrwcron: found, so it can be
        fixed or deleted)."""
        return (
            partitions.job_key(name, ()),
            partitions.job_key(name, (partitions.TAGGED,)),
            name,
        )

    async def _stored(self, name: str) -> _Stored:
        keys = self._keys_of(name)
        found = await asyncio.gather(*(last_message(self._js, self._bucket, k) for k in keys))
        revisions = {key: revision for key, (revision, _) in zip(keys, found, strict=True)}
        live = sorted(
            ((revision, key, data) for key, (revision, data) in zip(keys, found, strict=True)),
            reverse=True,
        )
        live = [item for item in live if item[2] is not None]
        live_keys = tuple((key, revision) for revision, key, _ in live)
        if not live:
            return _Stored("", 0, None, None, revisions, ())
        revision, key, data = live[0]
        assert data is not None
        try:
            spec: JobSpec | None = decode_job(data, where=key)
        except Exception:
            spec = None
        return _Stored(key, revision, data, spec, revisions, live_keys)

    def _subject_of(self, stored: _Stored) -> str | None:
        return stored.spec.trigger_subject(self._prefix) if stored.spec is not None else None

    async def _learn_lanes(self) -> None:
        """A bucket without lanes is looked at again before each write: once it is migrated,
        a bare-name key would be invisible to replicas that watch only their lanes."""
        if not self.lanes:
            self.lanes = await has_lanes(self._js, self._bucket)

    async def _write(self, spec: JobSpec, last_revision: int | None, claims: str | None) -> int:
        await self._learn_lanes()
        key = self._key(spec)
        subject = spec.trigger_subject(self._prefix)
        data = encode(spec)
        for _ in range(WRITE_ATTEMPTS):
            current = await self._stored(spec.name)
            if last_revision == 0 and current.live:
                raise ConflictError(f"job {spec.name!r} already exists")
            if last_revision and current.revision != last_revision:
                raise ConflictError(
                    f"job {spec.name!r} changed since revision {last_revision}: read it again "
                    "and retry"
                )
            if claims is not None and not await self._hold_subject(subject, spec.name, claims):
                continue  # lost a race on the subject claim: look again
            revision = await conditional_put(
                self._js, self._bucket, key, data, current.revisions.get(key, 0), None
            )
            if revision is None:
                continue  # the job changed meanwhile: check the caller's revision again
            for old_key, old_revision in current.live_keys:
                if old_key == key:
                    continue
                if not await conditional_delete(self._js, self._bucket, old_key, old_revision):
                    # Written meanwhile under its old key: undo the move, as a conflict.
                    with contextlib.suppress(Exception):
                        await conditional_delete(self._js, self._bucket, key, revision)
                    raise ConflictError(
                        f"job {spec.name!r} changed while it moved to key {key!r}: read it "
                        "again and retry"
                    )
            old = self._subject_of(current)
            if claims is not None and old is not None and old != subject:
                await self._release_subject(old, spec.name, claims)
            return revision
        raise ConflictError(
            f"job {spec.name!r} or its subject {subject!r} kept changing while it was written; "
            "retry"
        )

    async def _hold_subject(self, subject: str, name: str, claims: str) -> bool:
        """Make ``name`` the holder of ``subject``'s claim. False when a concurrent write won
        a compare-and-set (read again); SubjectTakenError when another job uses it."""
        key = SUBJECT_CLAIM + subject
        revision, data = await last_message(self._js, claims, key)
        holder = _claim_holder(data)
        mine = encode(SubjectClaim(job=name))
        if holder is not None and holder != name:
            other = await self._stored(holder)
            if self._subject_of(other) == subject:
                raise SubjectTakenError(subject, holder)
            # Stale. Rewriting the holder's key makes its in-flight write, if any, fail.
            if other.data is not None:
                rewritten = await conditional_put(
                    self._js, self._bucket, other.key, other.data, other.revision, None
                )
                touched = rewritten is not None
            else:
                touched = all(
                    [
                        await conditional_delete(self._js, self._bucket, k, r)
                        for k, r in other.revisions.items()
                    ]
                )
            if not touched:
                return False
        # Also when this job holds it already: a new revision makes a concurrent take-over,
        # which read the old one, fail.
        return await conditional_put(self._js, claims, key, mine, revision, None) is not None

    async def _release_subject(self, subject: str, name: str, claims: str) -> None:
        """Drop ``name``'s claim on a subject it no longer uses. Best effort: a claim left
        behind is stale and taken over by the next job that asks for the subject."""
        key = SUBJECT_CLAIM + subject
        with contextlib.suppress(Exception):
            revision, data = await last_message(self._js, claims, key)
            if _claim_holder(data) == name:
                await conditional_delete(self._js, claims, key, revision)

    async def delete(self, name: str, last_revision: int | None) -> None:
        """Delete the job under every key it has, each compare-and-set on the revision just
        read; with ``last_revision``, only if the job is still at that revision."""
        for _ in range(WRITE_ATTEMPTS):
            current = await self._stored(name)
            if last_revision is not None and current.revision != last_revision:
                raise ConflictError(
                    f"job {name!r} changed since revision {last_revision}: read it again and retry"
                )
            removed = [
                await conditional_delete(self._js, self._bucket, key, revision)
                for key, revision in current.live_keys
            ]
            if all(removed):
                subject = self._subject_of(current)
                if subject is not None and self._claims is not None:
                    await self._release_subject(subject, name, self._claims)
                return
            if last_revision is not None:
                raise ConflictError(
                    f"job {name!r} changed since revision {last_revision}: read it again and retry"
                )
        raise ConflictError(f"job {name!r} kept changing while it was deleted; retry")

    async def delete_many(
        self, items: Sequence[tuple[str, int | None]], *, in_flight: int = WRITE_IN_FLIGHT
    ) -> list[Exception | None]:
        """Delete every ``(name, last_revision)`` as :meth:`delete` would, ``in_flight`` at a
        time; the answer per item is None or the error ``delete`` would have raised."""
        return await _each(items, lambda item: self.delete(*item), in_flight)

    async def last_revision(self) -> int:
        info = await self._js.stream_info(f"KV_{self._bucket}")
        return int(info.state.last_seq or 0)

    async def watch(
        self, lanes: Collection[str] | None = None
    ) -> AsyncIterator[JobEvent | Covered | None]:
        """Every job's newest message, then None, then every change; with ``lanes``, only the
        jobs of those lanes when the bucket has lanes (without lanes, every job: the caller
        keeps what it holds)."""
        keys = (
            None
            if lanes is None or not self.lanes
            else [f"{partitions.KEY_PREFIX}{lane}.>" for lane in sorted(lanes)]
        )
        async for entry in watch_subjects(
            self._watch_js, self._bucket, keys, check_every=self._covered_every, nudge=self._nudge
        ):
            if entry is None:
                yield None
            elif isinstance(entry, int):
                yield Covered(entry)
            elif entry.key != partitions.LAYOUT_KEY:
                yield self._event(entry)

    def nudge(self) -> None:
        """Have every watch say how far it has got as soon as it can."""
        self._nudge.set()

    async def migrate(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Move every job stored under its bare name to its lane's key, then mark the bucket
        as having lanes; returns how many moved. Each move is compare-and-set, so a job
        edited meanwhile is read again and moved on the next pass."""
        moved = 0
        for _ in range(WRITE_ATTEMPTS):
            legacy = [
                entry
                for entry in await snapshot(self._js, self._bucket)
                if partitions.split_key(entry.key)[0] is None and entry.key != partitions.LAYOUT_KEY
            ]
            if not legacy:
                break
            for done, entry in enumerate(legacy, 1):
                moved += await self._move_legacy(entry)
                if progress is not None:
                    progress(done, len(legacy))
        await mark_lanes(self._js, self._bucket)
        self.lanes = True
        return moved

    async def _move_legacy(self, entry: KeyValue.Entry) -> int:
        data = entry.value or b""
        try:
            tags: Sequence[str] = decode_job(data, where=entry.key).tags
        except Exception:
            tags = ()  # unreadable: moved as it is, and still reported as a bad job
        key = partitions.job_key(entry.key, tags)
        revision, _ = await last_message(self._js, self._bucket, key)
        written = await conditional_put(self._js, self._bucket, key, data, revision, None)
        if written is None:
            return 0
        if not await conditional_delete(
            self._js, self._bucket, entry.key, int(entry.revision or 0)
        ):
            with contextlib.suppress(Exception):
                await conditional_delete(self._js, self._bucket, key, written)
            return 0
        return 1


async def has_lanes(js: JetStreamContext, bucket: str) -> bool:
    """Whether the jobs bucket has lanes: its layout marker is there."""
    _, data = await last_message(js, bucket, partitions.LAYOUT_KEY)
    return data == partitions.LAYOUT


async def mark_lanes(js: JetStreamContext, bucket: str) -> None:
    """Write the layout marker (once: a marker already there stays as it is). Right after
    the bucket was created, a replicated one may have no leader yet to answer: the write is
    tried again for a while (MARK_WAIT_S) rather than failing the provisioning."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MARK_WAIT_S
    pause = 0.05
    while True:
        try:
            await create_only(js, bucket, partitions.LAYOUT_KEY, partitions.LAYOUT)
            return
        except (NoStreamResponseError, NoRespondersError, NatsTimeoutError):
            if loop.time() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


T = TypeVar("T")


async def _each(
    items: Sequence[T], action: Callable[[T], Awaitable[None]], in_flight: int
) -> list[Exception | None]:
    """``action`` on every item, ``in_flight`` at a time; per item None or its error."""
    slots = asyncio.Semaphore(in_flight)

    async def one(item: T) -> Exception | None:
        async with slots:
            try:
                await action(item)
            except Exception as exc:
                return exc
            return None

    return list(await asyncio.gather(*(one(item) for item in items)))


def _claim_holder(data: bytes | None) -> str | None:
    if not data:
        return None
    try:
        return msgspec.json.decode(data, type=SubjectClaim).job
    except msgspec.MsgspecError:
        return None  # unreadable: nobody holds it
