"""The members bucket on JetStream: one key per replica, kept alive by its heartbeats."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import (
    conditional_put,
    create_only,
    deleted,
    entry_or_none,
    last_message,
    latest,
    watch_entries,
)
from hrwcron.core.errors import ConflictError, DuplicateNodeError
from hrwcron.core.model import (
    Heartbeat,
    encode,
)
from hrwcron.engine.ports import MemberRecord, StoreUnavailable


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
            entry = await entry_or_none(self._kv, node)
            if entry is None or deleted(entry):
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
        entry = await entry_or_none(self._kv, node)
        if entry is None or deleted(entry):
            # Our key expired while we could not reach NATS: we are simply back.
            created = await create_only(self._js, self._bucket, node, data)
            if created is not None:
                return created
            # It is there after all: a beat of ours that timed out can land after the key
            # expired, and the read above may come from a server that had not seen it yet.
            # The stream's leader says whose it is, as for any key found held.
            revision, value = await last_message(self._js, self._bucket, node)
            if value is None:
                # Gone again meanwhile: no one holds it; the next beat creates it.
                raise StoreUnavailable(f"member key {node!r} came and went while rejoining")
            if _instance(value) == heartbeat.instance:
                return revision
            raise ConflictError(f"member key {node!r} is held by instance {_instance(value)}")
        held = msgspec.json.decode(entry.value or b"{}", type=Heartbeat)
        if held.instance == heartbeat.instance and entry.revision is not None:
            return entry.revision  # our previous write landed but its ack was lost
        raise ConflictError(f"member key {node!r} is held by instance {held.instance}")

    async def deregister(self, node: str) -> None:
        await self._kv.delete(node)

    async def snapshot(self) -> dict[str, MemberRecord]:
        found: dict[str, MemberRecord] = {}
        for key, value, revision in await latest(self._js, self._bucket):
            record = _member_record(value, revision)
            if record is not None:
                found[key] = record
        return found

    async def watch(self) -> AsyncIterator[tuple[str, MemberRecord | None]]:
        async for entry in watch_entries(self._kv):
            if entry is not None:
                yield entry.key, (None if deleted(entry) else _member(entry))

    async def stored_at(self, revision: int) -> float | None:
        message = await self._js.get_msg(f"KV_{self._bucket}", seq=revision)
        return message.time.timestamp() * 1000 if message.time else None


def _instance(value: bytes) -> str:
    try:
        return msgspec.json.decode(value, type=Heartbeat).instance
    except msgspec.MsgspecError:
        return "?"


def _member(entry: KeyValue.Entry) -> MemberRecord | None:
    return _member_record(entry.value or b"", int(entry.revision or 0))


def _member_record(value: bytes, revision: int) -> MemberRecord | None:
    try:
        heartbeat = msgspec.json.decode(value, type=Heartbeat)
    except msgspec.MsgspecError:
        return None
    return MemberRecord(heartbeat, revision)
