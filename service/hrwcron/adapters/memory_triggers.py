"""The in-memory trigger stream: Msg-Id deduplication within a window, subject-sequence
fencing and the per-subject last trigger, as JetStream does them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hrwcron.engine.ports import (
    HEADER_KIND,
    HEADER_MSG_ID,
    HEADER_RUN,
    HEADER_WATERMARK,
    FenceConflict,
    LastTrigger,
    Published,
    StoreUnavailable,
    TriggerRecord,
    TriggerWrite,
)

T = TypeVar("T")


def answered(value: T | None = None, error: BaseException | None = None) -> asyncio.Future[T]:
    """A future that already holds its answer: memory stores answer a batch at once."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)  # type: ignore[arg-type]
    return future


@dataclass(frozen=True)
class StoredTrigger:
    seq: int
    subject: str
    body: bytes
    headers: dict[str, str]
    stored_ms: float


class MemoryTriggers:
    """A stream with Msg-Id deduplication over a window and per-subject sequence fencing."""

    def __init__(self, duplicate_window: float = 600.0, timeout: float = 5.0) -> None:
        self.duplicate_window = duplicate_window
        self.timeout = timeout
        self.silenced: set[str] = set()  # subjects whose publishes get no answer, as in a hang
        self.messages: list[StoredTrigger] = []
        self._ids: dict[str, tuple[int, float]] = {}
        self._last: dict[str, StoredTrigger] = {}
        self._listeners: list[asyncio.Queue[tuple[str, LastTrigger]]] = []
        self._seq = 0  # stream sequences are never reused, even after messages are dropped

    async def publish_many(self, writes: Sequence[TriggerWrite]) -> list[asyncio.Future[Published]]:
        found: list[asyncio.Future[Published]] = []
        for subject, body, headers, expected in writes:
            if subject in self.silenced:
                found.append(self._unanswered())
                continue
            try:
                found.append(answered(self._store(subject, body, headers, expected)))
            except FenceConflict as exc:
                found.append(answered(error=exc))
        return found

    def _unanswered(self) -> asyncio.Future[Published]:
        """What a JetStream adapter gives a write nobody answered: unavailable at the deadline."""
        future: asyncio.Future[Published] = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not future.done():
                future.set_exception(StoreUnavailable(f"no answer within {self.timeout:g} s"))

        asyncio.get_running_loop().call_later(self.timeout, expire)
        return future

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        if subject in self.silenced:
            return await self._unanswered()
        return self._store(subject, body, headers, expected_last_seq)

    def _store(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        now = time.time() * 1000
        msg_id = headers.get(HEADER_MSG_ID, "")
        # nats-server checks the expected sequence before the Msg-Id: a retry that carries a
        # stale expectation is fenced even when it would also be a duplicate.
        last = self._last.get(subject)
        if (last.seq if last else 0) != expected_last_seq:
            raise FenceConflict(f"{subject}: last sequence is {last.seq if last else 0}")
        seen = self._ids.get(msg_id)
        if msg_id and seen and now - seen[1] < self.duplicate_window * 1000:
            return Published(seen[0], duplicate=True)
        self._seq += 1
        stored = StoredTrigger(self._seq, subject, body, dict(headers), now)
        self.messages.append(stored)
        self._last[subject] = stored
        if msg_id:
            self._ids[msg_id] = (stored.seq, now)
        seen_last = _as_last(stored)
        for queue in self._listeners:
            queue.put_nowait((subject, seen_last))
        return Published(stored.seq, duplicate=False)

    async def last(self, subject: str) -> LastTrigger | None:
        stored = self._last.get(subject)
        return _as_last(stored) if stored else None

    async def last_many(self, subjects: Sequence[str]) -> dict[str, LastTrigger]:
        return {s: _as_last(self._last[s]) for s in set(subjects) if s in self._last}

    def forget(self, subject: str) -> None:
        """Drop every message of ``subject``, as the stream's max_age eventually does."""
        self.messages = [m for m in self.messages if m.subject != subject]
        self._last.pop(subject, None)

    async def follow(self) -> AsyncIterator[tuple[str, LastTrigger] | None]:
        queue: asyncio.Queue[tuple[str, LastTrigger]] = asyncio.Queue()
        self._listeners.append(queue)
        try:
            for subject, stored in list(self._last.items()):
                yield subject, _as_last(stored)
            yield None
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(queue)

    async def history(self, subject: str, limit: int, before_seq: int = 0) -> list[TriggerRecord]:
        mine = [
            _as_record(m)
            for m in self.messages
            if m.subject == subject and (not before_seq or m.seq < before_seq)
        ]
        return mine[-limit:] if limit > 0 else []

    async def since(self, subject: str, since_ms: float, limit: int) -> list[TriggerRecord]:
        found = [
            _as_record(m, body=False)
            for m in self.messages
            if m.subject == subject and m.stored_ms >= since_ms
        ]
        return found[:limit]


def _as_record(stored: StoredTrigger, body: bool = True) -> TriggerRecord:
    return TriggerRecord(
        stored.seq,
        stored.subject,
        stored.headers.get(HEADER_MSG_ID, ""),
        stored.stored_ms,
        dict(stored.headers),
        stored.body if body else b"",
    )


def _as_last(stored: StoredTrigger) -> LastTrigger:
    return LastTrigger(
        stored.seq,
        stored.headers.get(HEADER_MSG_ID, ""),
        int(stored.headers.get(HEADER_WATERMARK, "0")),
        int(stored.headers.get(HEADER_RUN, "0")),
    )


def is_scheduled(stored: StoredTrigger) -> bool:
    return stored.headers.get(HEADER_KIND, "scheduled") == "scheduled"
