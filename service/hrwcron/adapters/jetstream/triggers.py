"""Publishing triggers with Msg-Id deduplication and subject-sequence fencing, and following
the trigger stream (last message per subject, then live) headers-only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hrwcron.adapters.jetstream.kv import EXPECTED_LAST_SUBJECT_SEQ, nothing_to_read
from hrwcron.adapters.jetstream.pipeline import (
    WRONG_LAST_SEQUENCE,
    JetStreamPipeline,
    PubAck,
    api_error,
    first,
)
from hrwcron.engine.ports import (
    HEADER_MSG_ID,
    HEADER_RUN,
    HEADER_WATERMARK,
    FenceConflict,
    LastTrigger,
    Published,
    TriggerRecord,
    TriggerWrite,
)

# last_many: subjects per ephemeral consumer, and consumers read at once.
LAST_MANY_CHUNK = 200
LAST_MANY_IN_FLIGHT = 4


def _position(reply: str) -> tuple[int, int]:
    """(stream sequence, messages pending) from a JetStream delivery's reply subject, without
    building nats-py's Metadata (two dataclasses and a datetime per message):
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``, or the form
    with domain and account hash after ``ACK`` (and a random token at the end)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[8])
    return int(tokens[7]), int(tokens[10])


def _published(ack: PubAck) -> Published:
    error = ack.error
    if error is not None:
        if error.err_code in WRONG_LAST_SEQUENCE:
            raise FenceConflict(error.description)
        raise api_error(error)
    return Published(ack.seq, ack.duplicate)


def _number(headers: Mapping[str, str], name: str) -> int:
    try:
        return int(headers.get(name, "0"))
    except ValueError:
        return 0


def _last(seq: int, headers: Mapping[str, str] | None) -> LastTrigger:
    headers = headers or {}
    return LastTrigger(
        seq,
        headers.get(HEADER_MSG_ID, ""),
        _number(headers, HEADER_WATERMARK),
        _number(headers, HEADER_RUN),
    )


class JetStreamTriggers:
    """Triggers go out through the pipeline, which also refuses one the server would close
    the connection over (larger than its max_payload, a subject too long for a control line)
    before it is sent: StoreRefused for that trigger, the connection untouched."""

    def __init__(
        self, js: JetStreamContext, stream: str, subject_prefix: str, pipeline: JetStreamPipeline
    ) -> None:
        self._js = js
        self._stream = stream
        self._prefix = subject_prefix
        self._pipeline = pipeline

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        return await first(
            await self.publish_many([(subject, body, dict(headers), expected_last_seq)])
        )

    async def publish_many(self, writes: Sequence[TriggerWrite]) -> list[asyncio.Future[Published]]:
        # No Nats-Expected-Stream: every stored header is parsed again by every replica's
        # feed, and the server refuses overlapping stream subjects anyway.
        messages = []
        for subject, body, headers, expected in writes:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected)
            messages.append((subject, body, headers))
        return await self._pipeline.publish_many(messages, _published)

    async def last(self, subject: str) -> LastTrigger | None:
        try:
            message = await self._js.get_last_msg(self._stream, subject)
        except NotFoundError:
            return None
        return _last(int(message.seq or 0), message.headers)

    async def last_many(
        self, subjects: Sequence[str], timeout: float = 10.0
    ) -> dict[str, LastTrigger]:
        """The newest trigger of each of ``subjects`` that has one, through ephemeral
        consumers delivering the last message per subject, headers only: a request per
        :data:`LAST_MANY_CHUNK` subjects and a small message per subject. (The server's cost
        of one consumer grows faster than its filter list: 5,000 subjects take six times as
        long in one consumer as in chunks.)"""
        wanted = sorted(set(subjects))
        found: dict[str, LastTrigger] = {}
        chunks = [wanted[i : i + LAST_MANY_CHUNK] for i in range(0, len(wanted), LAST_MANY_CHUNK)]
        for start in range(0, len(chunks), LAST_MANY_IN_FLIGHT):
            reads = chunks[start : start + LAST_MANY_IN_FLIGHT]
            for part in await asyncio.gather(*(self._last_of(c, timeout) for c in reads)):
                found.update(part)
        return found

    async def _last_of(self, wanted: list[str], timeout: float) -> dict[str, LastTrigger]:
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            queue.put_nowait(msg)

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            headers_only=True,
            filter_subjects=wanted,
        )
        subscription = await self._js.subscribe(
            wanted[0], stream=self._stream, cb=deliver, ordered_consumer=True, config=config
        )
        found: dict[str, LastTrigger] = {}
        try:
            if nothing_to_read(await subscription.consumer_info()):
                return found
            async with asyncio.timeout(timeout):
                while True:
                    msg = await queue.get()
                    seq, pending = _position(msg.reply)
                    found[msg.subject] = _last(seq, msg.headers)
                    if pending == 0:
                        return found
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def follow(self) -> AsyncIterator[tuple[str, LastTrigger] | None]:
        """The newest trigger of every subject, then ``None``, then every new trigger."""
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            queue.put_nowait(msg)

        subscription = await self._js.subscribe(
            f"{self._prefix}.>",
            stream=self._stream,
            cb=deliver,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            headers_only=True,
        )
        try:
            info = await subscription.consumer_info()
            loaded = nothing_to_read(info)
            if loaded:
                yield None
            while True:
                msg = await queue.get()
                seq, pending = _position(msg.reply)
                yield msg.subject, _last(seq, msg.headers)
                if not loaded and pending == 0:
                    loaded = True
                    yield None
        finally:
            # On a closed connection this raises, and would replace a cancellation.
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def history(self, subject: str, limit: int, before_seq: int = 0) -> list[TriggerRecord]:
        """Reads backwards in growing windows of stream sequences: the stream interleaves every
        job, so how far back ``limit`` messages of one subject lie is only known by looking."""
        if limit <= 0:
            return []
        try:
            newest = await self._js.get_last_msg(self._stream, subject)
        except NotFoundError:
            return []
        last_seq = int(newest.seq or 0)
        if before_seq:
            last_seq = min(last_seq, before_seq - 1)
        info = await self._js.stream_info(self._stream)
        first_seq = int(info.state.first_seq or 1)
        if last_seq < first_seq:
            return []
        window = max(64, 4 * limit)
        while True:
            start = max(first_seq, last_seq - window + 1)
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
            )
            found = await self._read(subject, config, last_seq, limit=None)
            # The read stops at the first message at or past last_seq, which may be past it.
            found = [record for record in found if record.seq <= last_seq]
            if len(found) >= limit or start <= first_seq:
                return found[-limit:]
            window *= 8

    async def since(self, subject: str, since_ms: float, limit: int) -> list[TriggerRecord]:
        start = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start, headers_only=True
        )
        return await self._read(subject, config, None, limit=limit)

    async def _read(
        self, subject: str, config: ConsumerConfig, until_seq: int | None, limit: int | None
    ) -> list[TriggerRecord]:
        """Messages of ``subject`` through an ordered consumer until the consumer has nothing
        pending, ``until_seq`` is reached or ``limit`` messages were read."""
        subscription = await self._js.subscribe(
            subject, stream=self._stream, ordered_consumer=True, config=config
        )
        found: list[TriggerRecord] = []
        try:
            info = await subscription.consumer_info()
            if nothing_to_read(info):
                return found
            while limit is None or len(found) < limit:
                msg = await subscription.next_msg(timeout=5)
                meta = msg.metadata
                seq = int(meta.sequence.stream)
                headers = dict(msg.headers or {})
                stored = meta.timestamp.timestamp() * 1000 if meta.timestamp else 0.0
                found.append(
                    TriggerRecord(
                        seq, msg.subject, headers.get(HEADER_MSG_ID, ""), stored, headers, msg.data
                    )
                )
                if (until_seq is not None and seq >= until_seq) or meta.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return found
