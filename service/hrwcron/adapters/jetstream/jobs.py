"""The jobs bucket on JetStream: job specs, each write holding a claim on its trigger subject."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import (
    conditional_delete,
    conditional_put,
    conditional_writes,
    create_only,
    deleted,
    entry_or_none,
    last_message,
    snapshot,
    watch_entries,
)
from hrwcron.adapters.jetstream.pipeline import (
    WRONG_LAST_SEQUENCE,
    JetStreamPipeline,
)
from hrwcron.core.errors import ConflictError, SubjectTakenError
from hrwcron.core.model import (
    DEFAULT_SUBJECT_PREFIX,
    JobSpec,
    decode_job,
    encode,
)
from hrwcron.engine.ports import JobEvent, StoreUnavailable

# Subject claims live in the claims bucket under keys that no tick claim can have: a claim key
# starts with a job name, whose tokens never hold '='.
SUBJECT_CLAIM = "=subject."
# Compare-and-set rounds a job write may lose to concurrent writers before it gives up.
WRITE_ATTEMPTS = 8
# Job writes of one batch that take the full path (reads, claim, job) at the same time.
WRITE_IN_FLIGHT = 256


class SubjectClaim(msgspec.Struct, kw_only=True):
    """The value of a subject claim: the job that publishes on the subject."""

    job: str
    v: int = 1


class _Stored(msgspec.Struct, frozen=True):
    """A job key's newest message: its revision (deletions included, 0 for none), its value
    (None when deleted or never written) and the spec when that value is a valid one."""

    revision: int
    data: bytes | None
    spec: JobSpec | None

    @property
    def live(self) -> bool:
        return self.data is not None


class JetStreamJobs:
    """Job specs in the jobs bucket. With ``claims_bucket`` every write also holds a
    create-only claim on the job's trigger subject (key ``=subject.<subject>`` in that bucket),
    so two jobs can never be written with one subject, whichever replicas write them.

    The claim is written before the job, both compare-and-set. A claim whose job does not
    use its subject (left by a crash between the two writes, or by a job that moved on) is
    taken over: first the holder's key is rewritten compare-and-set, so a write of the holder
    still in flight (it read that revision) fails instead of landing on a subject it no
    longer holds, then the claim itself is replaced compare-and-set."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: KeyValue,
        bucket: str,
        *,
        claims_bucket: str | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
        pipeline: JetStreamPipeline | None = None,
    ) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self._claims = claims_bucket
        self._prefix = subject_prefix
        self._pipeline = pipeline

    @staticmethod
    def _event(entry: KeyValue.Entry) -> JobEvent:
        revision = int(entry.revision or 0)
        created: Any = entry.created
        written = created.timestamp() * 1000 if hasattr(created, "timestamp") else 0.0
        if deleted(entry):
            return JobEvent(entry.key, None, revision, written_ms=written)
        try:
            spec = decode_job(entry.value or b"", where=entry.key)
        except Exception as exc:
            return JobEvent(entry.key, None, revision, error=str(exc), written_ms=written)
        return JobEvent(entry.key, spec, revision, written_ms=written)

    async def snapshot(self) -> dict[str, JobEvent]:
        return {e.key: self._event(e) for e in await snapshot(self._js, self._bucket)}

    async def get(self, name: str) -> JobEvent | None:
        entry = await entry_or_none(self._kv, name)
        return None if entry is None or deleted(entry) else self._event(entry)

    async def put(self, spec: JobSpec, last_revision: int | None) -> int:
        if self._claims is not None:
            return await self._put_holding_subject(spec, last_revision, self._claims)
        data = encode(spec)
        if last_revision is None:
            return int(await self._kv.put(spec.name, data))
        if last_revision == 0:
            revision = await create_only(self._js, self._bucket, spec.name, data)
        else:
            revision = await conditional_put(
                self._js, self._bucket, spec.name, data, last_revision, None
            )
        if revision is None:
            raise ConflictError(
                f"job {spec.name!r} changed since revision {last_revision}: read it again and retry"
                if last_revision
                else f"job {spec.name!r} already exists"
            )
        return revision

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
            (f"$KV.{self._bucket}.{items[i][0].name}", encode(items[i][0]), 0) for i in holding
        ]
        written = await conditional_writes(pipeline, job_writes)
        for index, answer in zip(holding, written, strict=True):
            if answer is not None:
                results[index] = answer

    async def _stored(self, name: str) -> _Stored:
        revision, data = await last_message(self._js, self._bucket, name)
        if data is None:
            return _Stored(revision, None, None)
        try:
            return _Stored(revision, data, decode_job(data, where=name))
        except Exception:
            return _Stored(revision, data, None)

    def _subject_of(self, stored: _Stored) -> str | None:
        return stored.spec.trigger_subject(self._prefix) if stored.spec is not None else None

    async def _put_holding_subject(
        self, spec: JobSpec, last_revision: int | None, claims: str
    ) -> int:
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
            if not await self._hold_subject(subject, spec.name, claims):
                continue  # lost a race on the subject claim: look again
            revision = await conditional_put(
                self._js, self._bucket, spec.name, data, current.revision, None
            )
            if revision is None:
                continue  # the job changed meanwhile: check the caller's revision again
            old = self._subject_of(current)
            if old is not None and old != subject:
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
                    self._js, self._bucket, holder, other.data, other.revision, None
                )
                touched = rewritten is not None
            else:
                touched = await conditional_delete(self._js, self._bucket, holder, other.revision)
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
        current = await self._stored(name) if self._claims is not None else None
        await self._delete(name, last_revision)
        subject = self._subject_of(current) if current is not None else None
        if subject is not None and self._claims is not None:
            await self._release_subject(subject, name, self._claims)

    async def delete_many(
        self, items: Sequence[tuple[str, int | None]], *, in_flight: int = WRITE_IN_FLIGHT
    ) -> list[Exception | None]:
        """Delete every ``(name, last_revision)`` as :meth:`delete` would, ``in_flight`` at a
        time; the answer per item is None or the error ``delete`` would have raised."""
        return await _each(items, lambda item: self.delete(*item), in_flight)

    async def _delete(self, name: str, last_revision: int | None) -> None:
        try:
            await self._kv.delete(name, last=last_revision)
        except APIError as exc:
            # nats-py raises its KeyWrongLastSequenceError only for some server answers; the
            # server's own code says the same thing.
            stale = isinstance(exc, KeyWrongLastSequenceError) or (
                exc.err_code in WRONG_LAST_SEQUENCE
            )
            if not stale:
                raise
            raise ConflictError(
                f"job {name!r} changed since revision {last_revision}: read it again and retry"
            ) from None

    async def last_revision(self) -> int:
        info = await self._js.stream_info(f"KV_{self._bucket}")
        return int(info.state.last_seq or 0)

    async def watch(self) -> AsyncIterator[JobEvent | None]:
        async for entry in watch_entries(self._kv):
            yield None if entry is None else self._event(entry)


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
