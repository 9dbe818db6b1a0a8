"""Publishing triggers with Msg-Id deduplication and subject-sequence fencing, and following
the trigger stream (last message per subject, then live) headers-only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime

from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError

from ..model import MAX_SUBJECT_LENGTH
from ..ports import (
    HEADER_MSG_ID,
    HEADER_RUN,
    HEADER_WATERMARK,
    FenceConflict,
    LastTrigger,
    Published,
    PublishRejected,
    TriggerRecord,
)
from .kv import EXPECTED_LAST_SUBJECT_SEQ, WRONG_LAST_SEQUENCE, nothing_to_read


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


def message_size(body: bytes, headers: Mapping[str, str]) -> int:
    """Bytes a message with headers counts against max_payload: the NATS/1.0 header block
    (``Name: value`` lines and a blank line) plus the body."""
    block = len(b"NATS/1.0\r\n") + 2
    block += sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return block + len(body)


def refusal(exc: Exception) -> str | None:
    """Why a failed publish can never succeed as it is, or None when a retry may. The stream
    answers 400 for a message it will not store (too large for it, a bad header); 503s,
    timeouts and lost connections are passing trouble."""
    if isinstance(exc, MaxPayloadError):
        return "it is larger than the server's max_payload"
    if isinstance(exc, APIError) and exc.code in (400, 413):
        return f"{exc.description or 'refused'} (JetStream error {exc.err_code})"
    return None


class JetStreamTriggers:
    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        subject_prefix: str,
        *,
        max_payload: Callable[[], int] | None = None,
    ) -> None:
        """``max_payload`` reads the connected server's limit (it may change on reconnect);
        without it the size of a trigger is left to the server."""
        self._js = js
        self._stream = stream
        self._prefix = subject_prefix
        self._max_payload = max_payload

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        sent = dict(headers)
        sent[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_seq)
        # nats-server closes the whole connection over an oversized message or control line,
        # and nats-py never reconnects after that: refuse such a trigger here instead.
        limit = self._max_payload() if self._max_payload is not None else 0
        size = message_size(body, sent)
        if limit and size > limit:
            raise PublishRejected(
                f"the trigger is {size} bytes with its headers, more than the server's "
                f"max_payload ({limit} bytes)"
            )
        if len(subject) > MAX_SUBJECT_LENGTH:
            raise PublishRejected(
                f"its subject is {len(subject)} characters, more than {MAX_SUBJECT_LENGTH}"
            )
        try:
            ack = await self._js.publish(subject, body, stream=self._stream, headers=sent)
        except (APIError, MaxPayloadError) as exc:
            if isinstance(exc, APIError) and exc.err_code in WRONG_LAST_SEQUENCE:
                raise FenceConflict(str(exc)) from None
            why = refusal(exc)
            if why is not None:
                raise PublishRejected(why) from None
            raise
        return Published(int(ack.seq), bool(ack.duplicate))

    async def last(self, subject: str) -> LastTrigger | None:
        try:
            message = await self._js.get_last_msg(self._stream, subject)
        except NotFoundError:
            return None
        return _last(int(message.seq or 0), message.headers)

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
                meta = msg.metadata
                yield msg.subject, _last(int(meta.sequence.stream), msg.headers)
                if not loaded and meta.num_pending == 0:
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
