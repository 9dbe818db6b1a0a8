"""The engine's KV-backed ports on JetStream: members, claims, jobs and worker run markers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, DeliverPolicy
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from hrwcron.adapters.jetstream.pipeline import (
    WRONG_LAST_SEQUENCE,
    JetStreamPipeline,
    first,
    sequence_or_none,
)
from hrwcron.core.errors import ConflictError, DuplicateNodeError, SubjectTakenError
from hrwcron.core.model import (
    DEFAULT_SUBJECT_PREFIX,
    ClaimRecord,
    Heartbeat,
    JobSpec,
    decode_job,
    encode,
)
from hrwcron.engine.ports import ClaimWrite, JobEvent, MemberRecord, StoreUnavailable

MARKER_REASON = "Nats-Marker-Reason"  # a server-placed TTL or purge marker, not a value
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
MSG_TTL = "Nats-TTL"


async def conditional_put(
    js: JetStreamContext, bucket: str, key: str, value: bytes, last: int, ttl: float | None
) -> int | None:
    """Write ``key`` only if its revision is ``last`` (0: only if absent), with a per-key TTL.

    nats-py's ``KeyValue.update`` cannot carry a TTL and ``create`` retries on tombstones, so
    both go straight to the stream with the expected-last-subject-sequence header."""
    try:
        ack = await js.publish(
            f"$KV.{bucket}.{key}",
            value,
            headers={EXPECTED_LAST_SUBJECT_SEQ: str(last)},
            msg_ttl=max(1, round(ttl)) if ttl else None,
        )
    except APIError as exc:
        if exc.err_code in WRONG_LAST_SEQUENCE:
            return None
        raise
    return int(ack.seq)


async def conditional_delete(js: JetStreamContext, bucket: str, key: str, last: int) -> bool:
    """Place a delete marker on ``key`` only if its revision is ``last`` (0: it has none)."""
    try:
        await js.publish(
            f"$KV.{bucket}.{key}",
            b"",
            headers={KV_OP: KV_DEL, EXPECTED_LAST_SUBJECT_SEQ: str(last)},
        )
    except APIError as exc:
        if exc.err_code in WRONG_LAST_SEQUENCE:
            return False
        raise
    return True


async def last_message(js: JetStreamContext, bucket: str, key: str) -> tuple[int, bytes | None]:
    """The revision of ``key``'s newest message, deletions included (0 when it has none), and
    its value (None when deleted or never written)."""
    try:
        msg = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except NotFoundError:
        return 0, None
    headers = msg.headers or {}
    deleted = headers.get(KV_OP) in (KV_DEL, KV_PURGE) or MARKER_REASON in headers
    return int(msg.seq or 0), None if deleted else (msg.data or b"")


async def create_only(
    js: JetStreamContext, bucket: str, key: str, value: bytes, ttl: float | None = None
) -> int | None:
    """Create ``key`` if it holds no value, also when a delete marker is its last message
    (then the create is conditional on that marker's sequence). None when a value exists."""
    revision = await conditional_put(js, bucket, key, value, 0, ttl)
    if revision is not None:
        return revision
    try:
        last = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except NotFoundError:
        return None  # gone again meanwhile: let the caller retry
    operation = (last.headers or {}).get(KV_OP)
    if operation not in (KV_DEL, KV_PURGE) or last.seq is None:
        return None
    return await conditional_put(js, bucket, key, value, int(last.seq), ttl)


# Compare-and-set writes of a bulk write sent as one pipelined round, and how long one round
# may wait for its answers (the replica's own batches of ticks are far smaller and quicker).
BULK_ROUND = 4096
BULK_TIMEOUT = 30.0


async def conditional_writes(
    pipeline: JetStreamPipeline,
    writes: Sequence[tuple[str, bytes, int]],
    *,
    round_size: int = BULK_ROUND,
    timeout: float = BULK_TIMEOUT,
) -> list[int | Exception | None]:
    """Publish every ``(subject, value, expected last subject sequence)``, each
    compare-and-set like :func:`conditional_put`, through the pipeline in rounds of
    ``round_size``: the answer per write is its stream sequence, None when the expectation did
    not hold, or the error (StoreUnavailable: it may or may not have been applied). After a
    round with writes left unanswered, the rest is not sent: JetStream stopped answering."""
    results: list[int | Exception | None] = []
    for start in range(0, len(writes), round_size):
        messages = [
            (subject, value, {EXPECTED_LAST_SUBJECT_SEQ: str(last)})
            for subject, value, last in writes[start : start + round_size]
        ]
        futures = await pipeline.publish_many(messages, sequence_or_none, timeout=timeout)
        await asyncio.wait(futures)  # each is answered, refused or expired by the pipeline
        answers = [_answer(future) for future in futures]
        results += answers
        if any(isinstance(answer, StoreUnavailable) for answer in answers):
            unsent = StoreUnavailable("not written: JetStream stopped answering earlier writes")
            results += [unsent] * (len(writes) - len(results))
            break
    return results


def _answer(future: asyncio.Future[int | None]) -> int | Exception | None:
    error = future.exception()
    if error is None:
        return future.result()
    return error if isinstance(error, Exception) else StoreUnavailable(repr(error))


async def _entry(kv: KeyValue, key: str) -> KeyValue.Entry | None:
    try:
        return await kv.get(key)
    except KeyNotFoundError:
        return None


def nothing_to_read(info: ConsumerInfo) -> bool:
    """A new consumer with nothing pending and nothing delivered by the server. The client's
    own count of delivered messages is no substitute: a message the server sent is not
    counted until it has arrived whole, which for large ones takes a while."""
    delivered = info.delivered.consumer_seq if info.delivered else 0
    return (info.num_pending or 0) == 0 and not delivered


async def _snapshot(js: JetStreamContext, bucket: str) -> list[KeyValue.Entry]:
    """The newest entry of every live key, read through one ordered consumer. Not nats-py's
    watch: it announces the end of the initial values when the server had nothing pending as
    the watch began, even while those values are still arriving, and with large values a
    listing came back short or empty."""
    prefix = f"$KV.{bucket}."
    subscription = await js.subscribe(
        f"{prefix}>",
        stream=f"KV_{bucket}",
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
    entries: list[KeyValue.Entry] = []
    try:
        if nothing_to_read(await subscription.consumer_info()):
            return entries
        while True:
            msg = await subscription.next_msg(timeout=5)
            meta = msg.metadata
            headers = msg.headers or {}
            operation = headers.get(KV_OP)
            if operation not in (KV_DEL, KV_PURGE) and MARKER_REASON not in headers:
                entries.append(
                    KeyValue.Entry(
                        bucket=bucket,
                        key=msg.subject[len(prefix) :],
                        value=msg.data,
                        revision=int(meta.sequence.stream),
                        delta=meta.num_pending,
                        created=meta.timestamp,  # type: ignore[arg-type]
                        operation=operation,
                    )
                )
            if meta.num_pending == 0:
                return entries
    finally:
        # On a closed connection this raises, and would replace a cancellation.
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()


async def _latest(js: JetStreamContext, bucket: str) -> list[tuple[str, bytes, int]]:
    """(key, value, revision) of every live key, read without a consumer: the key list from
    the stream's per-subject state, then each key's last message. A consumer is a proposal to
    the cluster's meta layer; one per replica per membership refresh piled up faster than a
    cluster busy re-electing leaders deleted them, until consumer creation was refused
    (maximum consumers) and every replica's membership view went stale at once."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(stream, subjects_filter=f"{prefix}>")
    found: list[tuple[str, bytes, int]] = []
    for subject in sorted(info.state.subjects or {}):
        try:
            msg = await js.get_last_msg(stream, subject)
        except NotFoundError:
            continue  # expired since the listing
        headers = msg.headers or {}
        if headers.get(KV_OP) in (KV_DEL, KV_PURGE) or MARKER_REASON in headers:
            continue
        found.append((subject[len(prefix) :], msg.data or b"", int(msg.seq or 0)))
    return found


async def _watch(kv: KeyValue) -> AsyncIterator[KeyValue.Entry | None]:
    watcher = await kv.watchall()
    try:
        async for entry in watcher:
            yield entry
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()


def _deleted(entry: KeyValue.Entry) -> bool:
    return entry.operation in (KV_DEL, KV_PURGE)


class JetStreamMembers:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket

    async def register(self, node: str, heartbeat: Heartbeat, wait: float) -> int:
        """Create the member key; if it exists, wait for it to expire unless its owner is alive."""
        data = encode(heartbeat)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        first: int | None = None
        while True:
            revision = await create_only(self._js, self._bucket, node, data)
            if revision is not None:
                return revision
            entry = await _entry(self._kv, node)
            if entry is None or _deleted(entry):
                await asyncio.sleep(0.05)  # it changed under us: look again shortly
                continue
            if first is None:
                first = entry.revision
            elif entry.revision != first or loop.time() > deadline:
                other = msgspec.json.decode(entry.value or b"{}", type=dict[str, Any])
                raise DuplicateNodeError(
                    f"node id {node!r} is already used by a live replica "
                    f"(instance {other.get('instance', '?')}, started at "
                    f"{other.get('started_ms', '?')} ms); give each replica its own node_id"
                )
            await asyncio.sleep(0.2)

    async def beat(self, node: str, heartbeat: Heartbeat, last_revision: int) -> int:
        data = encode(heartbeat)
        revision = await conditional_put(self._js, self._bucket, node, data, last_revision, None)
        if revision is not None:
            return revision
        entry = await _entry(self._kv, node)
        if entry is None or _deleted(entry):
            # Our key expired while we could not reach NATS: we are simply back.
            created = await create_only(self._js, self._bucket, node, data)
            if created is None:
                raise ConflictError(f"member key {node!r} reappeared while rejoining")
            return created
        held = msgspec.json.decode(entry.value or b"{}", type=Heartbeat)
        if held.instance == heartbeat.instance and entry.revision is not None:
            return entry.revision  # our previous write landed but its ack was lost
        raise ConflictError(f"member key {node!r} is held by instance {held.instance}")

    async def deregister(self, node: str) -> None:
        await self._kv.delete(node)

    async def snapshot(self) -> dict[str, MemberRecord]:
        found: dict[str, MemberRecord] = {}
        for key, value, revision in await _latest(self._js, self._bucket):
            record = _member_record(value, revision)
            if record is not None:
                found[key] = record
        return found

    async def watch(self) -> AsyncIterator[tuple[str, MemberRecord | None]]:
        async for entry in _watch(self._kv):
            if entry is not None:
                yield entry.key, (None if _deleted(entry) else _member(entry))

    async def stored_at(self, revision: int) -> float | None:
        message = await self._js.get_msg(f"KV_{self._bucket}", seq=revision)
        return message.time.timestamp() * 1000 if message.time else None


def _member(entry: KeyValue.Entry) -> MemberRecord | None:
    return _member_record(entry.value or b"", int(entry.revision or 0))


def _member_record(value: bytes, revision: int) -> MemberRecord | None:
    try:
        heartbeat = msgspec.json.decode(value, type=Heartbeat)
    except msgspec.MsgspecError:
        return None
    return MemberRecord(heartbeat, revision)


class JetStreamClaims:
    """Claims are conditional writes to the bucket's stream, sent through the pipeline: a
    create expects the key's last revision to be 0, a takeover the revision it read."""

    def __init__(
        self, js: JetStreamContext, kv: KeyValue, bucket: str, pipeline: JetStreamPipeline
    ) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self._pipeline = pipeline
        self._subject = f"$KV.{bucket}."

    def _write(
        self, key: str, record: ClaimRecord, last: int, ttl: float
    ) -> tuple[str, bytes, dict[str, str]]:
        headers = {EXPECTED_LAST_SUBJECT_SEQ: str(last), MSG_TTL: str(max(1, round(ttl)))}
        return self._subject + key, encode(record), headers

    async def create(self, key: str, record: ClaimRecord, ttl: float) -> int | None:
        return await first(await self.create_many([(key, record, ttl)]))

    async def create_many(self, writes: Sequence[ClaimWrite]) -> list[asyncio.Future[int | None]]:
        return await self._pipeline.publish_many(
            [self._write(key, record, 0, ttl) for key, record, ttl in writes], sequence_or_none
        )

    async def get(self, key: str) -> tuple[ClaimRecord, int] | None:
        entry = await _entry(self._kv, key)
        if entry is None or _deleted(entry) or not entry.value:
            return None
        return msgspec.json.decode(entry.value, type=ClaimRecord), int(entry.revision or 0)

    async def replace(
        self, key: str, record: ClaimRecord, last_revision: int, ttl: float
    ) -> int | None:
        write = self._write(key, record, last_revision, ttl)
        return await first(await self._pipeline.publish_many([write], sequence_or_none))

    async def release(self, key: str, last_revision: int) -> bool:
        """Remove the claim's message itself. A delete marker would not do: a create expects
        the key to have no message at all (last sequence 0), so the retry the released claim
        is for would find it taken. The bucket keeps one message per key, so a claim still at
        ``last_revision`` is that sequence's message, and purging the key below the next
        sequence can never remove a newer claim, even one written meanwhile."""
        stream = f"KV_{self._bucket}"
        subject = self._subject + key
        try:
            held = await self._js.get_msg(stream, last_revision)
        except NotFoundError:
            return False
        if held.subject != subject:
            return False
        return await self._js.purge_stream(stream, seq=last_revision + 1, subject=subject)


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
        if _deleted(entry):
            return JobEvent(entry.key, None, revision, written_ms=written)
        try:
            spec = decode_job(entry.value or b"", where=entry.key)
        except Exception as exc:
            return JobEvent(entry.key, None, revision, error=str(exc), written_ms=written)
        return JobEvent(entry.key, spec, revision, written_ms=written)

    async def snapshot(self) -> dict[str, JobEvent]:
        return {e.key: self._event(e) for e in await _snapshot(self._js, self._bucket)}

    async def get(self, name: str) -> JobEvent | None:
        entry = await _entry(self._kv, name)
        return None if entry is None or _deleted(entry) else self._event(entry)

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
        async for entry in _watch(self._kv):
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


class JetStreamRuns:
    """Run markers that workers keep alive while a job runs (per-key TTL)."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def running(self, job: str) -> bool:
        entry = await _entry(self._kv, job)
        return entry is not None and not _deleted(entry) and bool(entry.value)
