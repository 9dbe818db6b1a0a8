"""Tick claims and run markers on JetStream: short-lived keys that say a tick is taken or a
job is running."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import (
    EXPECTED_LAST_SUBJECT_SEQ,
    MSG_TTL,
    deleted,
    entry_or_none,
)
from hrwcron.adapters.jetstream.pipeline import (
    JetStreamPipeline,
    first,
    sequence_or_none,
)
from hrwcron.core.model import (
    ClaimRecord,
    encode,
)
from hrwcron.engine.ports import ClaimWrite


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
        entry = await entry_or_none(self._kv, key)
        if entry is None or deleted(entry) or not entry.value:
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


class JetStreamRuns:
    """Run markers that workers keep alive while a job runs (per-key TTL)."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def running(self, job: str) -> bool:
        entry = await entry_or_none(self._kv, job)
        return entry is not None and not deleted(entry) and bool(entry.value)
