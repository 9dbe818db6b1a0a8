"""Helpers for the worker SDK tests: triggers published as a replica would, and records read
back from the buckets."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from hrwcron.core.model import TriggerMessage, encode
from hrwcron.core.resources import TRIGGER_STREAM as STREAM


async def publish(nc: Client, job: str, due_ms: int, headers: dict[str, str] | None = None) -> str:
    """A trigger for ``job`` due at ``due_ms``, with its tick key as ``Nats-Msg-Id``."""
    tick = f"{job}:{due_ms}"
    body = TriggerMessage(
        job=job,
        tick=tick,
        due="",
        due_ms=due_ms,
        fired_at="",
        node="test",
        attempt=1,
        payload={"n": due_ms},
    )
    sent = {"Nats-Msg-Id": tick, **(headers or {})}
    await nc.jetstream().publish(f"hrwcron.trigger.{job}", encode(body), headers=sent)
    return tick


async def revision(nc: Client, bucket: str, key: str) -> int:
    """The key's current revision, 0 when it has no value."""
    kv = await nc.jetstream().key_value(bucket)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return 0
    return int(entry.revision or 0)


async def marker(nc: Client, job: str, bucket: str = "hrwcron_runs") -> dict[str, object] | None:
    """The run marker of ``job`` as JSON, None when there is none."""
    kv = await nc.jetstream().key_value(bucket)
    try:
        entry = await kv.get(job)
    except KeyNotFoundError:
        return None
    return msgspec.json.decode(entry.value or b"null") if entry.value else None


async def settled(nc: Client, durable: str) -> bool:
    """True when the consumer has nothing pending: every delivery acked or terminated."""
    info = await nc.jetstream().consumer_info(STREAM, durable)
    return info.num_ack_pending == 0 and info.num_pending == 0
