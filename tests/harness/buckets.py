"""What a key-value bucket holds, read the way the service reads it. nats-py's ``kv.keys()``
can say "no keys" for a bucket that has some (its watch announces the end of the initial
values when the server had nothing pending as it began, before they arrive), which fails a
test at random and would let a checker pass over an empty list."""

from __future__ import annotations

from nats.aio.client import Client

from hrwcron.adapters.jetstream.kv import snapshot


async def live_keys(client: Client, bucket: str) -> list[str]:
    """Every key of ``bucket`` with a value (deleted and purged keys left out), sorted."""
    return sorted(entry.key for entry in await snapshot(client.jetstream(), bucket))
