"""Pipelined JetStream publishes: many writes sent back to back, each answered on its own.

``JetStreamContext.publish`` costs a request future, a ``wait_for``, header checks and a PubAck
object per message, and a caller that wants many in flight needs a task for each. Here a batch
is written with core publishes whose reply subjects lie under one wildcard inbox subscription
per connection; each reply resolves its own future, decoded with msgspec. A batch has one
deadline: whatever is unanswered by then fails as ambiguous (the write may or may not have been
applied), and so does everything in flight when the connection drops.

Nothing is buffered while disconnected: the client is built with ``pending_size=0``, so a
publish made while it reconnects raises at once, and that write fails as unavailable without
being sent.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, OutboundBufferLimitError

from ..ports import StoreRefused, StoreUnavailable

T = TypeVar("T")

WRONG_LAST_SEQUENCE = (10071, 10164)
NO_RESPONDERS = "503"
_STATUS = "Status"


class ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct):
    """A JetStream publish answer: an acknowledgement, or ``error`` set."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: ApiError | None = None


_decode_ack = msgspec.json.Decoder(PubAck).decode

# What a batch's caller makes of an answer: a value, or an exception to raise for that write.
Resolver = Callable[[PubAck], Any]


def refused(error: ApiError) -> StoreRefused:
    return StoreRefused(
        f"JetStream refused the write: {error.description or 'no description'} "
        f"(code {error.code}, error {error.err_code})",
        err_code=error.err_code,
    )


class JetStreamPipeline:
    """Pipelined publishes on one connection. Constructing it does nothing; the reply
    subscription is made by the first batch."""

    def __init__(self, client: Client, timeout: float = 5.0) -> None:
        self._client = client
        self.timeout = timeout
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
    ) -> list[asyncio.Future[Any]]:
        """Send every ``(subject, body, headers)`` now; one future per message, resolved with
        ``resolve(answer)`` (or what it raises), StoreUnavailable when there was no answer in
        time, no responders or the connection dropped, StoreRefused when the client refused
        to send it."""
        if not self._prefix:
            await self._start()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        pending = self._pending
        publish = self._client.publish
        prefix = self._prefix
        tokens: list[str] = []
        down: Exception | None = None
        for subject, body, headers in messages:
            future: asyncio.Future[Any] = loop.create_future()
            futures.append(future)
            if down is not None:
                future.set_exception(down)
                continue
            token = str(next(self._tokens))
            pending[token] = (future, resolve)
            try:
                await publish(subject, body, reply=prefix + token, headers=headers)
            except MaxPayloadError:
                pending.pop(token, None)
                future.set_exception(
                    StoreRefused(f"{subject}: {len(body)} bytes exceed the server's max_payload")
                )
                continue
            except OutboundBufferLimitError:
                pending.pop(token, None)
                down = StoreUnavailable("not connected to NATS; nothing was sent")
                future.set_exception(down)
                continue
            except Exception as exc:
                pending.pop(token, None)
                down = StoreUnavailable(f"publish failed: {type(exc).__name__}: {exc}")
                future.set_exception(down)
                continue
            tokens.append(token)
        if tokens:
            loop.call_later(self.timeout, self._expire, tokens)
        return futures

    def _expire(self, tokens: list[str]) -> None:
        pending = self._pending
        for token in tokens:
            entry = pending.pop(token, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(
                    StoreUnavailable(f"no answer from JetStream within {self.timeout:g} s")
                )

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
        raise refused(error)
    return ack.seq


async def first(futures: Sequence[asyncio.Future[T]]) -> T:
    """The answer of a one-message batch."""
    return await futures[0]
