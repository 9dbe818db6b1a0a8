"""Pipelined JetStream publishes: many writes sent back to back, each answered on its own.

``JetStreamContext.publish`` costs a request future, a ``wait_for``, header checks and a PubAck
object per message, and a caller that wants many in flight needs a task for each. Here a batch
is written with core publishes whose reply subjects lie under one wildcard inbox subscription
per connection; each reply resolves its own future, decoded with msgspec. A batch has one
deadline: whatever is unanswered by then fails as ambiguous (the write may or may not have been
applied), and so does everything in flight when the connection drops.

Nothing is buffered while disconnected: with the client's ``pending_size=0`` a batch is
refused as unavailable, unsent, whenever the client is not connected (what nats-py's publish
does too). Writes the client had accepted just before it noticed the drop stay in its buffer
and are flushed after the reconnect (nats-py's ``_attempt_reconnect`` flushes its pending
commands once connected again): their futures have failed as ambiguous by then, and what lands
late is a claim create that only this instance can use, or a trigger its Msg-Id and expected
subject sequence keep from being stored twice or out of order.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, OutboundBufferLimitError

from hrwcron.core.model import MAX_SUBJECT_LENGTH
from hrwcron.engine.ports import StoreRefused, StoreUnavailable

T = TypeVar("T")

WRONG_LAST_SEQUENCE = (10071, 10164)
NO_RESPONDERS = "503"
_STATUS = "Status"


class ServerApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct):
    """A JetStream publish answer: an acknowledgement, or ``error`` set."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: ServerApiError | None = None


_decode_ack = msgspec.json.Decoder(PubAck).decode
# A subject is sent as it is in a frame: whitespace in it would break the protocol line.
_BAD_SUBJECT = re.compile(r"[\s]").search

# What a batch's caller makes of an answer: a value, or an exception to raise for that write.
Resolver = Callable[[PubAck], Any]


# API answers for a message the stream will not store as it is (too large for it, a bad
# header): sending it again cannot succeed. Any other API error is passing trouble.
REFUSAL_CODES = (400, 413)


def api_error(error: ServerApiError) -> StoreRefused | StoreUnavailable:
    """What an API error answer means for the write: refused for good, or worth a retry."""
    text = (
        f"JetStream refused the write: {error.description or 'no description'} "
        f"(code {error.code}, error {error.err_code})"
    )
    if error.code in REFUSAL_CODES:
        return StoreRefused(text, err_code=error.err_code)
    return StoreUnavailable(text)


def message_size(body: bytes, headers: Mapping[str, str]) -> int:
    """Bytes a message with headers counts against max_payload: the NATS/1.0 header block
    (``Name: value`` lines and a blank line) plus the body."""
    block = len(b"NATS/1.0\r\n") + 2
    block += sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return block + len(body)


def unsendable(subject: str, size: int, limit: int) -> StoreRefused | None:
    """Why a message must not be sent at all, or None. nats-server closes the whole
    connection over a message above its max_payload or a control line too long (a subject),
    and nats-py does not reconnect after that: one bad message would take down every write."""
    if len(subject) > MAX_SUBJECT_LENGTH:
        return StoreRefused(
            f"its subject is {len(subject)} characters, more than {MAX_SUBJECT_LENGTH}"
        )
    if size > limit:
        return StoreRefused(
            f"the message is {size} bytes with its headers, more than the server's "
            f"max_payload ({limit} bytes)"
        )
    return None


class JetStreamPipeline:
    """Pipelined publishes on one connection. Constructing it does nothing; the reply
    subscription is made by the first batch."""

    def __init__(self, client: Client, timeout: float = 5.0, *, frames: bool = True) -> None:
        self._client = client
        self.timeout = timeout
        # Whole batches as raw protocol frames, through the client's own write buffer (so
        # its flusher, reconnect handling and pending_size rules apply), when it has one.
        self._raw = frames and all(
            hasattr(client, name) for name in ("_send_command", "_flush_pending", "_flush_queue")
        )
        self._prefix = ""
        self._tokens = itertools.count(1)
        # token -> (its future, how to read its answer)
        self._pending: dict[str, tuple[asyncio.Future[Any], Resolver]] = {}
        self._starting: asyncio.Lock | None = None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def _start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._prefix:
                return
            prefix = self._client.new_inbox() + "."
            await self._client.subscribe(prefix + "*", cb=self._on_reply)
            self._prefix = prefix

    async def publish_many(
        self,
        messages: Sequence[tuple[str, bytes, dict[str, str]]],
        resolve: Resolver,
        *,
        timeout: float | None = None,
    ) -> list[asyncio.Future[Any]]:
        """Send every ``(subject, body, headers)`` now; one future per message, resolved with
        ``resolve(answer)`` (or what it raises), StoreUnavailable when there was no answer in
        time (``timeout``, the pipeline's own by default), no responders or the connection
        dropped, StoreRefused when it could not be sent as it is (too large, a subject too
        long, a line break in a header)."""
        if not self._prefix:
            await self._start()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in messages]
        client = self._client
        if client.is_closed or client.is_draining_pubs or not client.is_connected:
            # What publish does with pending_size=0: nothing is buffered for a reconnect.
            down = StoreUnavailable("not connected to NATS; nothing was sent")
            for future in futures:
                future.set_exception(down)
            return futures
        if self._raw:
            tokens = await self._send_frames(messages, futures, resolve)
        else:
            tokens = await self._send_each(messages, futures, resolve)
        if tokens:
            wait = self.timeout if timeout is None else timeout
            loop.call_later(wait, self._expire, tokens, wait)
        return futures

    async def _send_frames(
        self,
        messages: Sequence[tuple[str, bytes, dict[str, str]]],
        futures: list[asyncio.Future[Any]],
        resolve: Resolver,
    ) -> list[str]:
        """The whole batch as one write of HPUB frames: nats-py's publish spends most of its
        time checking and encoding headers one by one, several times what the frame costs."""
        client = self._client
        limit = client.max_payload
        reply_prefix = self._prefix.encode()
        pending = self._pending
        tokens: list[str] = []
        frames: list[bytes] = []
        size_total = 0
        for (subject, body, headers), future in zip(messages, futures, strict=True):
            text = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            lines = len(headers) + 2
            if text.count("\n") != lines or text.count("\r") != lines or _BAD_SUBJECT(subject):
                future.set_exception(StoreRefused(f"{subject}: a line break or space in it"))
                continue
            header = text.encode()
            size = len(header) + len(body)
            refusal = unsendable(subject, size, limit)
            if refusal is not None:
                future.set_exception(refusal)
                continue
            token = str(next(self._tokens))
            pending[token] = (future, resolve)
            tokens.append(token)
            size_total += len(body)
            frames.append(
                b"HPUB %s %s%s %d %d\r\n%s%s\r\n"
                % (subject.encode(), reply_prefix, token.encode(), len(header), size, header, body)
            )
        if not frames:
            return tokens
        try:
            await client._send_command(b"".join(frames))
            if client._flush_queue is not None and client._flush_queue.empty():
                await client._flush_pending()
        except Exception as exc:
            self._fail(tokens, StoreUnavailable(f"publish failed: {type(exc).__name__}: {exc}"))
            return []
        client.stats["out_msgs"] += len(frames)
        client.stats["out_bytes"] += size_total
        return tokens

    async def _send_each(
        self,
        messages: Sequence[tuple[str, bytes, dict[str, str]]],
        futures: list[asyncio.Future[Any]],
        resolve: Resolver,
    ) -> list[str]:
        """One public publish per message, for a client without the internals used above."""
        pending = self._pending
        publish = self._client.publish
        prefix = self._prefix
        tokens: list[str] = []
        down: Exception | None = None
        limit = self._client.max_payload
        for (subject, body, headers), future in zip(messages, futures, strict=True):
            if down is not None:
                future.set_exception(down)
                continue
            # nats-py's own check counts the body only, not the headers.
            refusal = unsendable(subject, message_size(body, headers), limit)
            if refusal is not None:
                future.set_exception(refusal)
                continue
            token = str(next(self._tokens))
            pending[token] = (future, resolve)
            try:
                await publish(subject, body, reply=prefix + token, headers=headers)
            except MaxPayloadError:
                pending.pop(token, None)
                future.set_exception(StoreRefused("it is larger than the server's max_payload"))
                continue
            except Exception as exc:
                pending.pop(token, None)
                down = StoreUnavailable(f"publish failed: {type(exc).__name__}: {exc}")
                if isinstance(exc, OutboundBufferLimitError):
                    down = StoreUnavailable("not connected to NATS; nothing was sent")
                future.set_exception(down)
                continue
            tokens.append(token)
        return tokens

    def _fail(self, tokens: list[str], error: Exception) -> None:
        pending = self._pending
        for token in tokens:
            entry = pending.pop(token, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(error)

    def _expire(self, tokens: list[str], waited: float) -> None:
        self._fail(tokens, StoreUnavailable(f"no answer from JetStream within {waited:g} s"))

    def connection_lost(self) -> None:
        """Fail every write still waiting: its answer, if any, went to a dead connection."""
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(
                    StoreUnavailable("the connection to NATS dropped before the answer came")
                )

    async def _on_reply(self, msg: Msg) -> None:
        entry = self._pending.pop(msg.subject[len(self._prefix) :], None)
        if entry is None:
            return  # expired, or failed at a disconnect: its outcome is already decided
        future, resolve = entry
        if future.done():
            return
        headers = msg.headers
        status = headers.get(_STATUS) if headers else None
        if status is not None:
            reason = "no responders" if status == NO_RESPONDERS else f"status {status}"
            future.set_exception(StoreUnavailable(f"{reason}: the stream did not answer"))
            return
        try:
            future.set_result(resolve(_decode_ack(msg.data)))
        except Exception as exc:
            future.set_exception(exc)


def sequence_or_none(ack: PubAck) -> int | None:
    """For a conditional KV write: the new revision, or None when the key's last revision was
    not the expected one."""
    error = ack.error
    if error is not None:
        if error.err_code in WRONG_LAST_SEQUENCE:
            return None
        raise api_error(error)
    return ack.seq


async def first(futures: Sequence[asyncio.Future[T]]) -> T:
    """The answer of a one-message batch."""
    return await futures[0]
