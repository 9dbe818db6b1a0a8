"""Reads and compare-and-set writes straight on a KV bucket's stream, shared by every
KV-backed store (and the worker SDK): what nats-py's KeyValue cannot do or does slowly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import APIError, KeyNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from hrwcron.adapters.jetstream.pipeline import (
    WRONG_LAST_SEQUENCE,
    JetStreamPipeline,
    sequence_or_none,
)
from hrwcron.engine.ports import StoreUnavailable

MARKER_REASON = "Nats-Marker-Reason"  # a server-placed TTL or purge marker, not a value
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
MSG_TTL = "Nats-TTL"


def no_value(headers: dict[str, str] | None) -> bool:
    """Whether a KV message with these headers holds no value: a delete or purge marker, or a
    marker the server placed when a key's TTL ran out."""
    headers = headers or {}
    return headers.get(KV_OP) in (KV_DEL, KV_PURGE) or MARKER_REASON in headers


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
    return int(msg.seq or 0), None if no_value(msg.headers) else (msg.data or b"")


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


async def entry_or_none(kv: KeyValue, key: str) -> KeyValue.Entry | None:
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


def _entry(bucket: str, prefix: str, msg: Msg) -> KeyValue.Entry:
    """A KV message as an entry; a delete, a purge or a server's TTL marker as KV_DEL."""
    meta = msg.metadata
    return KeyValue.Entry(
        bucket=bucket,
        key=msg.subject[len(prefix) :],
        value=msg.data,
        revision=int(meta.sequence.stream),
        delta=meta.num_pending,
        created=meta.timestamp,  # type: ignore[arg-type]
        operation=KV_DEL if no_value(msg.headers) else None,
    )


async def snapshot(js: JetStreamContext, bucket: str) -> list[KeyValue.Entry]:
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
            if not no_value(msg.headers):
                entries.append(_entry(bucket, prefix, msg))
            if meta.num_pending == 0:
                return entries
    finally:
        # On a closed connection this raises, and would replace a cancellation.
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()


async def latest(js: JetStreamContext, bucket: str) -> list[tuple[str, bytes, int]]:
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
        if no_value(msg.headers):
            continue
        found.append((subject[len(prefix) :], msg.data or b"", int(msg.seq or 0)))
    return found


# Filter subjects per consumer: creating one with N filters costs the server more than N times
# one filter's work (about 0.2 s at 1,400 filters, 3 s at 5,500), so a watch over many subjects
# is several consumers of at most this many.
FILTERS_PER_CONSUMER = 1024
# While changes keep coming, how often a watch says how far it has got.
TELL_EVERY = 0.05


async def watch_subjects(
    js: JetStreamContext,
    bucket: str,
    keys: Sequence[str] | None,
    *,
    check_every: float = 5.0,
    nudge: asyncio.Event | None = None,
) -> AsyncIterator[KeyValue.Entry | int | None]:
    """The newest message of every key matching one of ``keys`` (subject patterns inside the
    bucket; None: every key), delete markers included, then None once every one of them has
    arrived, then every change. Ordered consumers, so a gap makes the client start over from
    where it was, and one consumer per FILTERS_PER_CONSUMER patterns.

    An int is a revision up to which every matching change has been delivered, yielded when it
    moves: a consumer has delivered every matching change before the newest one it delivered,
    and every one up to the stream's newest when it says it has nothing pending and has sent
    nothing not yet here (asked every ``check_every`` seconds, and when ``nudge`` is set). A
    consumer that is gone (a server restarted) ends the watch with StoreUnavailable, for the
    caller to start it again."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    chunks: list[list[str]] = (
        [[f"{prefix}>"]]
        if keys is None
        else [
            [prefix + key for key in keys[i : i + FILTERS_PER_CONSUMER]]
            for i in range(0, len(keys), FILTERS_PER_CONSUMER)
        ]
    )
    queue: asyncio.Queue[tuple[int, Msg]] = asyncio.Queue()
    subscriptions = []
    caught_up: set[int] = set()
    # Per consumer: the name and consumer sequence of the newest message yielded (what it has
    # sent beyond that is on its way), and the revision it has delivered everything up to.
    delivered: list[tuple[str, int]] = [("", 0)] * len(chunks)
    cover = [0] * len(chunks)
    told, tell_at = -1, 0.0
    loop = asyncio.get_running_loop()
    try:
        start = int((await js.stream_info(stream)).state.last_seq or 0)
        for index, filters in enumerate(chunks):

            async def deliver(msg: Msg, index: int = index) -> None:
                queue.put_nowait((index, msg))

            config = ConsumerConfig(
                filter_subjects=filters if len(filters) > 1 else None,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            )
            subscription = await js.subscribe(
                filters[0], stream=stream, cb=deliver, ordered_consumer=True, config=config
            )
            subscriptions.append(subscription)
            if nothing_to_read(await subscription.consumer_info()):
                caught_up.add(index)
        if len(caught_up) == len(chunks):
            cover = [max(c, start) for c in cover]
            yield None
        next_check = loop.time() + check_every
        nudged = nudge or asyncio.Event()
        while True:
            loaded = len(caught_up) == len(chunks)
            if loaded and min(cover) > told and (queue.empty() or loop.time() >= tell_at):
                told, tell_at = min(cover), loop.time() + TELL_EVERY
                yield told
            if nudged.is_set():
                next_check = min(next_check, loop.time())
            if not queue.empty():
                index, msg = queue.get_nowait()
            elif loaded and loop.time() >= next_check:
                index = -1
            else:
                index, msg = await _next_or_check(queue, nudged, next_check - loop.time())
            if index >= 0:
                meta = msg.metadata
                delivered[index] = (meta.consumer or "", int(meta.sequence.consumer))
                cover[index] = max(cover[index], int(meta.sequence.stream))
                yield _entry(bucket, prefix, msg)
                if index not in caught_up and meta.num_pending == 0:
                    caught_up.add(index)
                    if len(caught_up) == len(chunks):
                        cover = [max(c, start) for c in cover]
                        yield None
            elif loaded and loop.time() >= next_check:
                next_check = loop.time() + check_every
                nudged.clear()
                newest, drained = await _drained(js, stream, subscriptions, delivered)
                cover = [max(c, newest) if d else c for c, d in zip(cover, drained, strict=True)]
    finally:
        for subscription in subscriptions:
            # On a closed connection this raises, and would replace a cancellation.
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def _next_or_check(
    queue: asyncio.Queue[tuple[int, Msg]], nudge: asyncio.Event, timeout: float
) -> tuple[int, Any]:
    """The next message, or (-1, None) when ``timeout`` passed or ``nudge`` was set first."""
    getting = asyncio.ensure_future(queue.get())
    nudged = asyncio.ensure_future(nudge.wait())
    try:
        await asyncio.wait(
            {getting, nudged}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        nudged.cancel()
        if not getting.done():
            getting.cancel()
    if getting.done() and not getting.cancelled():
        return getting.result()
    return -1, None


async def _drained(
    js: JetStreamContext,
    stream: str,
    subscriptions: Sequence[Any],
    delivered: list[tuple[str, int]],
) -> tuple[int, list[bool]]:
    """The stream's newest revision, and per consumer whether it has nothing left for this
    watch (nothing pending, nothing sent that has not arrived)."""
    newest = int((await js.stream_info(stream)).state.last_seq or 0)
    drained = []
    for subscription, seen in zip(subscriptions, delivered, strict=True):
        try:
            info = await subscription.consumer_info()
        except NotFoundError:
            raise StoreUnavailable("a consumer of the jobs watch is gone") from None
        sent = int(info.delivered.consumer_seq or 0) if info.delivered else 0
        # An ordered consumer started over counts from 1 again: what it sent is unknown here
        # until one of its messages arrives.
        behind = sent > seen[1] if info.name == seen[0] else sent > 0
        drained.append(not (info.num_pending or 0) and not behind)
    return newest, drained


async def watch_entries(kv: KeyValue) -> AsyncIterator[KeyValue.Entry | None]:
    watcher = await kv.watchall()
    try:
        async for entry in watcher:
            yield entry
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()


def deleted(entry: KeyValue.Entry) -> bool:
    return entry.operation in (KV_DEL, KV_PURGE)
